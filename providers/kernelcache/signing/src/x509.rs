//! X.509 and PEM: certificate chains to trust anchors (rustls-webpki), the subjects (email
//! and URI SANs) and OIDC issuer of a signing certificate, its public key, and public key
//! fingerprints.

use rustls_pki_types::{CertificateDer, UnixTime};
use sha2::{Digest as _, Sha256};
use sigstore::crypto::CosignVerificationKey;

use crate::error::VerifyError;
use kubeairunway_kernelcache_artifact::registry::hex;

/// Code signing extended key usage (1.3.6.1.5.5.7.3.3), DER of the OID's value.
const EKU_CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];

/// `sha256:<first 16 hex digits>` of the DER SubjectPublicKeyInfo of a PEM public key.
pub fn key_fingerprint(pem: &str) -> Result<String, VerifyError> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| VerifyError::Policy(format!("public key is not PEM: {e}")))?;
    if pem.label != "PUBLIC KEY" {
        return Err(VerifyError::Policy(format!(
            "expected a PUBLIC KEY PEM block, found {}",
            pem.label
        )));
    }
    let hash = Sha256::digest(&pem.contents);
    Ok(format!("sha256:{}", hex(&hash[..8])))
}

/// The first email or URI SAN of `leaf` that `pattern` matches in full.
pub(crate) fn matching_subject(
    leaf: &[u8],
    pattern: &regex::Regex,
    pattern_text: &str,
) -> Result<String, VerifyError> {
    let subjects = san_subjects(leaf)?;
    subjects
        .iter()
        .find(|s| pattern.is_match(s))
        .cloned()
        .ok_or_else(|| VerifyError::SubjectMismatch {
            found: if subjects.is_empty() {
                "no email or URI SAN".into()
            } else {
                subjects.join(", ")
            },
            wanted: pattern_text.to_string(),
        })
}

/// A subject pattern anchored to match whole subjects only.
pub fn subject_regex(pattern: &str) -> Result<regex::Regex, VerifyError> {
    regex::Regex::new(&format!("^(?:{pattern})$"))
        .map_err(|e| VerifyError::Policy(format!("certificate.subjectPattern: {e}")))
}

/// The DER certificates of a PEM bundle (other PEM blocks are an error).
pub fn pem_certificates(pem: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| format!("not PEM: {e}"))?;
        if block.label != "CERTIFICATE" {
            return Err(format!("unexpected PEM block {}", block.label));
        }
        out.push(block.contents);
    }
    Ok(out)
}

/// Check that `leaf` chains through `chain` to one of `anchors` at `now`, for code
/// signing (when the certificate restricts its usage).
pub(crate) fn verify_chain(
    leaf: &[u8],
    chain: &[Vec<u8>],
    anchors: &[Vec<u8>],
    now: UnixTime,
) -> Result<(), VerifyError> {
    let anchor_ders: Vec<CertificateDer<'_>> = anchors
        .iter()
        .map(|d| CertificateDer::from(d.as_slice()))
        .collect();
    let mut trust_anchors = Vec::new();
    for der in &anchor_ders {
        trust_anchors.push(
            webpki::anchor_from_trusted_cert(der)
                .map_err(|e| VerifyError::Policy(format!("CA certificate: {e}")))?,
        );
    }
    let intermediates: Vec<CertificateDer<'_>> = chain
        .iter()
        .map(|d| CertificateDer::from(d.as_slice()))
        .collect();
    let leaf_der = CertificateDer::from(leaf);
    let end_entity = webpki::EndEntityCert::try_from(&leaf_der)
        .map_err(|e| VerifyError::Untrusted(format!("unparsable certificate: {e}")))?;
    end_entity
        .verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &trust_anchors,
            &intermediates,
            now,
            webpki::KeyUsage::required_if_present(EKU_CODE_SIGNING),
            None,
            None,
        )
        .map_err(|e| VerifyError::Untrusted(format!("{e:?}")))?;
    Ok(())
}

/// The email and URI SANs of a certificate.
pub(crate) fn san_subjects(der: &[u8]) -> Result<Vec<String>, VerifyError> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| VerifyError::Untrusted(format!("unparsable certificate: {e}")))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| VerifyError::Untrusted(format!("bad SAN extension: {e}")))?;
    Ok(san
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::RFC822Name(s) | GeneralName::URI(s) => Some((*s).to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default())
}

pub(crate) fn certificate_key(der: &[u8]) -> Result<CosignVerificationKey, VerifyError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| VerifyError::Untrusted(format!("unparsable certificate: {e}")))?;
    CosignVerificationKey::try_from_der(cert.public_key().raw)
        .map_err(|e| VerifyError::Untrusted(format!("unsupported certificate key: {e}")))
}

/// The OIDC issuer of a Fulcio certificate: extension 1.3.6.1.4.1.57264.1.8 (a DER
/// UTF8String), else the deprecated 1.3.6.1.4.1.57264.1.1 (the raw string).
pub(crate) fn oidc_issuer(der: &[u8]) -> Result<Option<String>, VerifyError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| VerifyError::Untrusted(format!("unparsable certificate: {e}")))?;
    let mut v1 = None;
    for ext in cert.extensions() {
        match ext.oid.to_id_string().as_str() {
            "1.3.6.1.4.1.57264.1.8" => {
                if let Some(s) = der_utf8(ext.value) {
                    return Ok(Some(s));
                }
            }
            "1.3.6.1.4.1.57264.1.1" => {
                v1 = std::str::from_utf8(ext.value).ok().map(str::to_string);
            }
            _ => {}
        }
    }
    Ok(v1)
}

/// The string of a DER UTF8String.
fn der_utf8(bytes: &[u8]) -> Option<String> {
    let (&tag, rest) = bytes.split_first()?;
    if tag != 0x0c {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 2 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |l, b| (l << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    std::str::from_utf8(rest.get(..len)?)
        .ok()
        .map(str::to_string)
}
