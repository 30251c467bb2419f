//! Cosign signature verification of a pinned cache image under a `KernelCachePolicySpec`.
//!
//! The signature is the cosign "simple signing" object stored under the tag
//! `sha256-<hex>.sig` next to the image, read with the bounded registry client
//! ([`crate::registry`]: at most [`MAX_SIGNATURES`] layers of at most 1 MiB, each checked
//! against its digest). Every mode checks that the signed payload names the pinned digest;
//! what makes a signature trusted depends on the mode:
//!
//! - `key`: signed by one of the policy's public keys (sigstore's `CosignVerificationKey`).
//!   The signer is the key's fingerprint.
//! - `certificate`: the layer carries a certificate (and optionally a chain) in cosign's
//!   `dev.sigstore.cosign/certificate` and `dev.sigstore.cosign/chain` annotations; the
//!   certificate must chain to the policy's CA bundle (rustls-webpki, now; every bundle
//!   certificate is a trust anchor, and the chain annotation supplies intermediates; the
//!   cosign 3.1.1 CLI leaves that annotation empty, so list intermediates in the bundle
//!   for its signatures), its email or
//!   URI SAN must fully match the subject pattern, and the signature must verify with the
//!   certificate's key. No network beyond the registry.
//! - `keyless`: a Fulcio certificate plus a Rekor bundle (`dev.sigstore.cosign/bundle`),
//!   checked offline against the policy's trust root: the bundle's SET with a Rekor key
//!   named by its log ID, the SHA-256 of the key (sigstore's `SignedArtifactBundle`); the
//!   certificate against the Fulcio certificates, for code signing, at the bundle's
//!   integration time (rustls-webpki); the log entry must be a `hashedrekord` of this
//!   payload, signature and certificate; the OIDC issuer (extension
//!   1.3.6.1.4.1.57264.1.8, else .1.1) and a subject (email or URI SAN) must equal the
//!   policy's; the signature must verify with the certificate's key. Not checked: Rekor
//!   inclusion proofs and CT SCTs (as with `cosign verify --offline` on a bundle's SET).
//! - `disabled`: nothing is checked and nothing is reported verified.
//!
//! `verify` returns `Ok` only for a signature that satisfied the policy (or for
//! `disabled`, with `verified: false`); every refusal is an error with its reason, which
//! [`refused`] turns into the status to show.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use oci_client::Reference;
use oci_client::manifest::OciImageManifest;
use oci_client::secrets::RegistryAuth;
use rustls_pki_types::{CertificateDer, UnixTime};
use sha2::{Digest as _, Sha256};
use sigstore::crypto::{CosignVerificationKey, Signature};

use crate::api::{KernelCachePolicySpec, Verification, VerificationMode};
use crate::bundle;
use crate::registry::{self, RegistryError, Timeouts};

/// The media type of cosign's simple-signing layers.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// Annotation holding the base64 signature of the layer.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// Annotation holding the signing certificate (PEM).
pub const CERTIFICATE_ANNOTATION: &str = "dev.sigstore.cosign/certificate";
/// Annotation holding the certificate chain (PEM, intermediates then root).
pub const CHAIN_ANNOTATION: &str = "dev.sigstore.cosign/chain";
/// Annotation holding the Rekor bundle (keyless).
pub const BUNDLE_ANNOTATION: &str = "dev.sigstore.cosign/bundle";
/// The message of mode `disabled`.
pub const DISABLED_MESSAGE: &str = "signature verification disabled by policy (development only)";

/// At most this many signature layers are read.
pub const MAX_SIGNATURES: usize = 64;
/// A signature layer larger than this is refused.
pub const MAX_SIGNATURE_BYTES: u64 = 1 << 20;

/// Code signing extended key usage (1.3.6.1.5.5.7.3.3), DER of the OID's value.
const EKU_CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];

/// Why an image's signature did not satisfy the policy.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The image reference does not parse, or is not pinned to a digest.
    #[error("invalid pinned reference {0:?}: {1}")]
    Reference(String, String),
    /// The policy itself is unusable (missing or unparsable keys, CA bundle, pattern).
    #[error("invalid verification policy: {0}")]
    Policy(String),
    /// The registry has no signature for the digest.
    #[error("no signature found for {0}")]
    NoSignature(String),
    /// Signatures exist, but none by a trusted key (wrong key, tampered signature).
    #[error("unsatisfied constraints: no signature by a trusted key ({0})")]
    Unsatisfied(String),
    /// The signing certificate does not chain to a trusted CA (or is expired, or not for
    /// code signing).
    #[error("certificate not trusted: {0}")]
    Untrusted(String),
    /// The certificate's subject does not match the policy.
    #[error("subject mismatch: {found} does not match {wanted}")]
    SubjectMismatch {
        /// The subjects (SANs) the certificate carries.
        found: String,
        /// The policy's pattern or exact subject.
        wanted: String,
    },
    /// The certificate's OIDC issuer does not match the policy.
    #[error("issuer mismatch: {found} is not {wanted}")]
    IssuerMismatch {
        /// The issuer the certificate names (or `none`).
        found: String,
        /// The policy's issuer.
        wanted: String,
    },
    /// The signature payload names another image than the pinned one.
    #[error("digest mismatch: the signature payload names {signed}, the image is {pinned}")]
    DigestMismatch {
        /// The digest in the signed payload.
        signed: String,
        /// The pinned digest.
        pinned: String,
    },
    /// The registry failed for good, or the signature object is malformed.
    #[error("registry: {0}")]
    Registry(String),
    /// The registry could not be reached, timed out, or answered `429` or `5xx`: no
    /// verdict, try again later.
    #[error("registry unavailable: {0}")]
    Unavailable(String),
}

impl VerifyError {
    /// Whether this is no verdict but a registry that may answer later.
    pub fn is_transient(&self) -> bool {
        matches!(self, VerifyError::Unavailable(_))
    }
}

impl From<RegistryError> for VerifyError {
    fn from(e: RegistryError) -> Self {
        if e.transient {
            VerifyError::Unavailable(e.message)
        } else {
            VerifyError::Registry(e.message)
        }
    }
}

/// The status to show for a refused image.
pub fn refused(mode: VerificationMode, error: &VerifyError) -> Verification {
    Verification {
        mode,
        verified: false,
        message: Some(error.to_string()),
        ..Verification::default()
    }
}

/// Verify the signature of `pinned` (`registry/repo@sha256:...`) under `policy`.
/// Registries in `plain_http` are spoken to over HTTP.
pub async fn verify(
    policy: &KernelCachePolicySpec,
    pinned: &str,
    auth: &RegistryAuth,
    plain_http: Vec<String>,
) -> Result<Verification, VerifyError> {
    let client = registry::Client::new(auth.clone(), plain_http, Timeouts::default());
    verify_with(policy, pinned, &client).await
}

/// [`verify`] with a registry client of the caller's.
pub async fn verify_with(
    policy: &KernelCachePolicySpec,
    pinned: &str,
    client: &registry::Client,
) -> Result<Verification, VerifyError> {
    let reference: Reference = pinned.parse().map_err(|e: oci_client::ParseError| {
        VerifyError::Reference(pinned.into(), e.to_string())
    })?;
    let digest = reference
        .digest()
        .ok_or_else(|| VerifyError::Reference(pinned.into(), "not pinned to a digest".into()))?
        .to_string();
    let signer = match policy.mode {
        VerificationMode::Key => verify_key(policy, &reference, &digest, client).await?,
        VerificationMode::Certificate => {
            verify_certificate(policy, &reference, &digest, client).await?
        }
        VerificationMode::Keyless => verify_keyless(policy, &reference, &digest, client).await?,
        VerificationMode::Disabled => {
            return Ok(Verification {
                mode: VerificationMode::Disabled,
                verified: false,
                message: Some(DISABLED_MESSAGE.to_string()),
                ..Verification::default()
            });
        }
    };
    Ok(Verification {
        mode: policy.mode,
        verified: true,
        signer: Some(signer),
        ..Verification::default()
    })
}

// --- key -------------------------------------------------------------------------------

async fn verify_key(
    policy: &KernelCachePolicySpec,
    reference: &Reference,
    digest: &str,
    client: &registry::Client,
) -> Result<String, VerifyError> {
    if policy.public_keys.is_empty() {
        return Err(VerifyError::Policy("mode key needs publicKeys".into()));
    }
    let mut keys = Vec::new();
    for (i, pem) in policy.public_keys.iter().enumerate() {
        let key = CosignVerificationKey::try_from_pem(pem.as_bytes())
            .map_err(|e| VerifyError::Policy(format!("publicKeys[{i}]: {e}")))?;
        keys.push((key_fingerprint(pem)?, key));
    }
    let found = fetch_all(client, reference, digest).await?;
    for sig in &found.legacy {
        let Ok(signature) = sig.signature() else {
            continue;
        };
        for (fingerprint, key) in &keys {
            if key
                .verify_signature(Signature::Base64Encoded(signature.as_bytes()), &sig.payload)
                .is_ok()
            {
                return Ok(fingerprint.clone());
            }
        }
    }
    let mut why = None;
    for bundle in &found.bundles {
        match bundle {
            Ok(signed) => {
                if let Some((fingerprint, _)) = keys.iter().find(|(_, k)| signed.verifies_with(k)) {
                    return Ok(fingerprint.clone());
                }
                why.get_or_insert_with(|| "signed by none of the policy's keys".to_string());
            }
            Err(e) => {
                why = Some(e.to_string());
            }
        }
    }
    Err(VerifyError::Unsatisfied(format!(
        "{} signature(s) and {} Sigstore bundle(s) checked against {} key(s){}",
        found.legacy.len(),
        found.bundles.len(),
        keys.len(),
        why.map(|w| format!("; the bundle: {w}"))
            .unwrap_or_default()
    )))
}

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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

// --- the signature object, read directly ------------------------------------------------

/// One simple-signing layer: its payload (digest-checked) and annotations.
#[derive(Debug, Clone)]
struct RawSignature {
    payload: Vec<u8>,
    annotations: BTreeMap<String, String>,
}

impl RawSignature {
    fn signature(&self) -> Result<&str, VerifyError> {
        self.annotations
            .get(SIGNATURE_ANNOTATION)
            .map(String::as_str)
            .ok_or_else(|| {
                VerifyError::Registry(format!("signature layer without {SIGNATURE_ANNOTATION}"))
            })
    }
}

/// Fetch the `sha256-<hex>.sig` manifest and its simple-signing layers (at most
/// [`MAX_SIGNATURES`], each at most [`MAX_SIGNATURE_BYTES`] and checked against its
/// digest); every payload must name `digest`.
async fn fetch_signatures(
    client: &registry::Client,
    reference: &Reference,
    digest: &str,
) -> Result<Vec<RawSignature>, VerifyError> {
    let tag = format!("{}.sig", digest.replace(':', "-"));
    let sig_ref = Reference::with_tag(
        reference.registry().to_string(),
        reference.repository().to_string(),
        tag,
    );
    let pinned = format!(
        "{}/{}@{digest}",
        reference.registry(),
        reference.repository()
    );
    let manifest = match client.manifest(&sig_ref).await {
        Ok(m) => m,
        Err(e) if e.not_found => return Err(VerifyError::NoSignature(pinned)),
        Err(e) => return Err(e.into()),
    };
    let manifest: OciImageManifest = serde_json::from_slice(&manifest.bytes).map_err(|e| {
        VerifyError::Registry(format!(
            "the signature manifest {sig_ref} does not parse: {e}"
        ))
    })?;
    if manifest.layers.len() > MAX_SIGNATURES {
        return Err(VerifyError::Registry(format!(
            "{} signature layers, more than the {MAX_SIGNATURES} checked",
            manifest.layers.len()
        )));
    }
    let mut out = Vec::new();
    for layer in &manifest.layers {
        if layer.media_type != SIMPLE_SIGNING_MEDIA_TYPE {
            continue;
        }
        let size = u64::try_from(layer.size).map_err(|_| {
            VerifyError::Registry(format!(
                "signature layer {} has a negative size",
                layer.digest
            ))
        })?;
        let payload = client
            .blob_bytes(&sig_ref, &layer.digest, Some(size), MAX_SIGNATURE_BYTES)
            .await?;
        let value: serde_json::Value = serde_json::from_slice(&payload)
            .map_err(|e| VerifyError::Registry(format!("signature payload is not JSON: {e}")))?;
        let signed = value
            .pointer("/critical/image/docker-manifest-digest")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| {
                VerifyError::Registry("signature payload names no docker-manifest-digest".into())
            })?;
        if signed != digest {
            return Err(VerifyError::DigestMismatch {
                signed: signed.to_string(),
                pinned: digest.to_string(),
            });
        }
        out.push(RawSignature {
            payload,
            annotations: layer.annotations.clone().unwrap_or_default(),
        });
    }
    if out.is_empty() {
        return Err(VerifyError::NoSignature(pinned));
    }
    Ok(out)
}

/// Every signature of `digest`: the legacy `.sig` object's layers and the Sigstore
/// bundles (each parsed and checked against the image, or why not). No signature of
/// either kind is [`VerifyError::NoSignature`].
struct Found {
    legacy: Vec<RawSignature>,
    bundles: Vec<Result<bundle::Signed, VerifyError>>,
}

async fn fetch_all(
    client: &registry::Client,
    reference: &Reference,
    digest: &str,
) -> Result<Found, VerifyError> {
    let legacy = match fetch_signatures(client, reference, digest).await {
        Ok(l) => l,
        Err(VerifyError::NoSignature(_)) => Vec::new(),
        Err(e) => return Err(e),
    };
    let bundles = fetch_bundles(client, reference, digest).await?;
    if legacy.is_empty() && bundles.is_empty() {
        return Err(VerifyError::NoSignature(format!(
            "{}/{}@{digest}",
            reference.registry(),
            reference.repository()
        )));
    }
    Ok(Found { legacy, bundles })
}

/// The Sigstore bundles whose subject is `digest`: found through the referrers API, or
/// its fallback tag `sha256-<hex>`; at most [`MAX_SIGNATURES`] manifests with layers of
/// at most [`MAX_SIGNATURE_BYTES`].
async fn fetch_bundles(
    client: &registry::Client,
    reference: &Reference,
    digest: &str,
) -> Result<Vec<Result<bundle::Signed, VerifyError>>, VerifyError> {
    let index = if let Some(index) = client.referrers(reference, digest).await? {
        index
    } else {
        let tag = Reference::with_tag(
            reference.registry().to_string(),
            reference.repository().to_string(),
            digest.replace(':', "-"),
        );
        match client.manifest(&tag).await {
            Ok(m) => m,
            Err(e) if e.not_found => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    };
    let index: serde_json::Value = serde_json::from_slice(&index.bytes)
        .map_err(|e| VerifyError::Registry(format!("the referrers index does not parse: {e}")))?;
    let manifests: Vec<&serde_json::Value> = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["artifactType"].as_str().is_none_or(|t| {
                bundle::is_bundle_type(t) || t == "application/vnd.oci.empty.v1+json"
            })
        })
        .collect();
    if manifests.len() > MAX_SIGNATURES {
        return Err(VerifyError::Registry(format!(
            "{} signature manifests, more than the {MAX_SIGNATURES} checked",
            manifests.len()
        )));
    }
    let mut out = Vec::new();
    for m in manifests {
        let Some(manifest_digest) = m["digest"].as_str() else {
            continue;
        };
        let pinned = Reference::with_digest(
            reference.registry().to_string(),
            reference.repository().to_string(),
            manifest_digest.to_string(),
        );
        let manifest = client.manifest(&pinned).await?;
        let manifest: OciImageManifest = serde_json::from_slice(&manifest.bytes).map_err(|e| {
            VerifyError::Registry(format!(
                "the signature manifest {pinned} does not parse: {e}"
            ))
        })?;
        if manifest.layers.len() > MAX_SIGNATURES {
            return Err(VerifyError::Registry(format!(
                "{} bundle layers, more than the {MAX_SIGNATURES} checked",
                manifest.layers.len()
            )));
        }
        for layer in manifest
            .layers
            .iter()
            .filter(|l| bundle::is_bundle_type(&l.media_type))
        {
            let size = u64::try_from(layer.size).ok();
            let bytes = client
                .blob_bytes(&pinned, &layer.digest, size, MAX_SIGNATURE_BYTES)
                .await?;
            out.push(bundle::parse(&bytes, digest));
        }
    }
    Ok(out)
}

// --- certificate --------------------------------------------------------------------------

async fn verify_certificate(
    policy: &KernelCachePolicySpec,
    reference: &Reference,
    digest: &str,
    client: &registry::Client,
) -> Result<String, VerifyError> {
    let cert_policy = policy
        .certificate
        .as_ref()
        .ok_or_else(|| VerifyError::Policy("mode certificate needs certificate".into()))?;
    let pattern = subject_regex(&cert_policy.subject_pattern)?;
    let anchors_der = pem_certificates(&cert_policy.ca_bundle)
        .map_err(|e| VerifyError::Policy(format!("certificate.caBundle: {e}")))?;
    if anchors_der.is_empty() {
        return Err(VerifyError::Policy(
            "certificate.caBundle holds no certificate".into(),
        ));
    }
    let found = fetch_all(client, reference, digest).await?;
    // Report the most telling failure when no signature passes.
    let mut failure: Option<VerifyError> = None;
    let results = found
        .legacy
        .iter()
        .map(|sig| {
            check_certificate_signature(sig, &anchors_der, &pattern, &cert_policy.subject_pattern)
        })
        .chain(found.bundles.into_iter().map(|b| {
            b.and_then(|signed| {
                check_bundle_certificate(
                    &signed,
                    &anchors_der,
                    &pattern,
                    &cert_policy.subject_pattern,
                )
            })
        }));
    for result in results {
        match result {
            Ok(subject) => return Ok(subject),
            Err(e) => {
                if failure.as_ref().is_none_or(|f| rank(&e) > rank(f)) {
                    failure = Some(e);
                }
            }
        }
    }
    Err(failure.unwrap_or_else(|| VerifyError::NoSignature(digest.to_string())))
}

/// How far a signature got before failing (for choosing which reason to show).
fn rank(e: &VerifyError) -> u8 {
    match e {
        VerifyError::Untrusted(_) => 1,
        VerifyError::SubjectMismatch { .. } | VerifyError::IssuerMismatch { .. } => 2,
        VerifyError::Unsatisfied(_) => 3,
        _ => 0,
    }
}

fn check_certificate_signature(
    sig: &RawSignature,
    anchors_der: &[Vec<u8>],
    pattern: &regex::Regex,
    pattern_text: &str,
) -> Result<String, VerifyError> {
    let leaf_pem = sig.annotations.get(CERTIFICATE_ANNOTATION).ok_or_else(|| {
        VerifyError::Untrusted(format!(
            "the signature carries no certificate ({CERTIFICATE_ANNOTATION})"
        ))
    })?;
    let leaf = pem_certificates(leaf_pem)
        .map_err(|e| VerifyError::Untrusted(format!("certificate annotation: {e}")))?
        .into_iter()
        .next()
        .ok_or_else(|| {
            VerifyError::Untrusted("certificate annotation holds no certificate".into())
        })?;
    let chain = match sig.annotations.get(CHAIN_ANNOTATION) {
        Some(pem) => pem_certificates(pem)
            .map_err(|e| VerifyError::Untrusted(format!("chain annotation: {e}")))?,
        None => Vec::new(),
    };
    verify_chain(&leaf, &chain, anchors_der, UnixTime::now())?;
    let subjects = san_subjects(&leaf)?;
    let Some(subject) = subjects.iter().find(|s| pattern.is_match(s)) else {
        return Err(VerifyError::SubjectMismatch {
            found: if subjects.is_empty() {
                "no email or URI SAN".into()
            } else {
                subjects.join(", ")
            },
            wanted: pattern_text.to_string(),
        });
    };
    verify_by_certificate(sig, &leaf)?;
    Ok(subject.clone())
}

/// The legacy signature `sig` checked with the public key of the certificate `leaf` (DER).
fn verify_by_certificate(sig: &RawSignature, leaf: &[u8]) -> Result<(), VerifyError> {
    certificate_key(leaf)?
        .verify_signature(
            Signature::Base64Encoded(sig.signature()?.as_bytes()),
            &sig.payload,
        )
        .map_err(|e| {
            VerifyError::Unsatisfied(format!(
                "the signature does not verify with the certificate's key: {e}"
            ))
        })
}

/// A Sigstore bundle in mode `certificate`: its certificate (and chain) to the CA bundle,
/// a SAN matching the pattern, the signature by the certificate's key.
fn check_bundle_certificate(
    signed: &bundle::Signed,
    anchors_der: &[Vec<u8>],
    pattern: &regex::Regex,
    pattern_text: &str,
) -> Result<String, VerifyError> {
    let (leaf, chain) = signed.certificates.split_first().ok_or_else(|| {
        VerifyError::Untrusted("Sigstore bundle: signed with a key, not a certificate".into())
    })?;
    verify_chain(leaf, chain, anchors_der, UnixTime::now())?;
    let subject = matching_subject(leaf, pattern, pattern_text)?;
    if !signed.verifies_with(&certificate_key(leaf)?) {
        return Err(VerifyError::Unsatisfied(
            "Sigstore bundle: the signature does not verify with the certificate's key".into(),
        ));
    }
    Ok(subject)
}

/// The first email or URI SAN of `leaf` that `pattern` matches in full.
fn matching_subject(
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
fn verify_chain(
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
fn san_subjects(der: &[u8]) -> Result<Vec<String>, VerifyError> {
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

fn certificate_key(der: &[u8]) -> Result<CosignVerificationKey, VerifyError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| VerifyError::Untrusted(format!("unparsable certificate: {e}")))?;
    CosignVerificationKey::try_from_der(cert.public_key().raw)
        .map_err(|e| VerifyError::Untrusted(format!("unsupported certificate key: {e}")))
}

// --- keyless ---------------------------------------------------------------------------------

/// The keyless trust root of a policy: Fulcio anchors (DER) and Rekor keys by log ID.
struct KeylessRoot {
    fulcio: Vec<Vec<u8>>,
    rekor: BTreeMap<String, CosignVerificationKey>,
}

fn keyless_root(policy: &KernelCachePolicySpec) -> Result<KeylessRoot, VerifyError> {
    let root = policy
        .trust_root
        .as_ref()
        .ok_or_else(|| VerifyError::Policy("mode keyless needs trustRoot".into()))?;
    let mut fulcio = Vec::new();
    for (i, pem) in root.fulcio_certificates.iter().enumerate() {
        fulcio.extend(
            pem_certificates(pem).map_err(|e| {
                VerifyError::Policy(format!("trustRoot.fulcioCertificates[{i}]: {e}"))
            })?,
        );
    }
    let mut rekor = BTreeMap::new();
    for (i, pem) in root.rekor_keys.iter().enumerate() {
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
            .map_err(|e| VerifyError::Policy(format!("trustRoot.rekorKeys[{i}]: not PEM: {e}")))?;
        let key = CosignVerificationKey::try_from_der(&block.contents)
            .map_err(|e| VerifyError::Policy(format!("trustRoot.rekorKeys[{i}]: {e}")))?;
        // Rekor names its keys by the hex SHA-256 of the DER public key (the log ID).
        rekor.insert(hex(&Sha256::digest(&block.contents)), key);
    }
    if fulcio.is_empty() || rekor.is_empty() {
        return Err(VerifyError::Policy(
            "trustRoot needs at least one Fulcio certificate and one Rekor key".into(),
        ));
    }
    Ok(KeylessRoot { fulcio, rekor })
}

async fn verify_keyless(
    policy: &KernelCachePolicySpec,
    reference: &Reference,
    digest: &str,
    client: &registry::Client,
) -> Result<String, VerifyError> {
    let identity = policy.keyless.as_ref().ok_or_else(|| {
        VerifyError::Policy("mode keyless needs keyless.issuer and keyless.subject".into())
    })?;
    let root = keyless_root(policy)?;
    let found = fetch_all(client, reference, digest).await?;
    let mut failure: Option<VerifyError> = None;
    let results = found
        .legacy
        .iter()
        .map(|sig| check_keyless_signature(sig, &root, &identity.issuer, &identity.subject))
        .chain(found.bundles.into_iter().map(|b| {
            b.and_then(|signed| {
                check_keyless_bundle(&signed, &root, &identity.issuer, &identity.subject)
            })
        }));
    for result in results {
        match result {
            Ok(subject) => return Ok(subject),
            Err(e) => {
                if failure.as_ref().is_none_or(|f| rank(&e) > rank(f)) {
                    failure = Some(e);
                }
            }
        }
    }
    Err(failure.unwrap_or_else(|| VerifyError::NoSignature(digest.to_string())))
}

/// One keyless signature: the Rekor bundle's SET, the certificate at the integration
/// time, the log entry, the identity, and the signature itself.
fn check_keyless_signature(
    sig: &RawSignature,
    root: &KeylessRoot,
    issuer: &str,
    subject: &str,
) -> Result<String, VerifyError> {
    let leaf_pem = sig.annotations.get(CERTIFICATE_ANNOTATION).ok_or_else(|| {
        VerifyError::Untrusted(format!(
            "no Fulcio certificate with the signature ({CERTIFICATE_ANNOTATION})"
        ))
    })?;
    let integrated = rekor_bundle_time(sig, leaf_pem, root)?;
    let leaf = fulcio_leaf_at(leaf_pem, root, integrated)?;
    check_rekor_entry(sig)?;
    keyless_identity(&leaf, issuer, subject)?;
    verify_by_certificate(sig, &leaf)?;
    Ok(subject.to_string())
}

/// The integration time of the signature's Rekor bundle (its annotation), once the
/// bundle's SET is verified with a trust-root Rekor key for this signature and
/// certificate.
fn rekor_bundle_time(
    sig: &RawSignature,
    leaf_pem: &str,
    root: &KeylessRoot,
) -> Result<u64, VerifyError> {
    let bundle_json = sig.annotations.get(BUNDLE_ANNOTATION).ok_or_else(|| {
        VerifyError::Untrusted(format!(
            "no Rekor bundle with the signature ({BUNDLE_ANNOTATION})"
        ))
    })?;
    let bundle: serde_json::Value = serde_json::from_str(bundle_json)
        .map_err(|_| VerifyError::Untrusted("Rekor bundle: not JSON".into()))?;
    // sigstore verifies the SET of a bundle given in this shape (cosign's blob bundle).
    let artifact = serde_json::json!({
        "base64Signature": sig.signature()?,
        "cert": leaf_pem,
        "rekorBundle": bundle,
    });
    let verified = sigstore::cosign::bundle::SignedArtifactBundle::new_verified(
        &artifact.to_string(),
        &root.rekor,
    )
    .map_err(|e| {
        VerifyError::Untrusted(format!(
            "Rekor bundle not signed by a trustRoot Rekor key: {e}"
        ))
    })?;
    u64::try_from(verified.rekor_bundle.payload.integrated_time)
        .map_err(|_| VerifyError::Untrusted("Rekor bundle: negative integration time".into()))
}

/// The certificate of a keyless signature (DER), once it chains to a trust-root Fulcio
/// certificate at `integrated` (seconds since the epoch: a Fulcio certificate lives
/// minutes, so it is judged at the time Rekor logged the signature).
fn fulcio_leaf_at(
    leaf_pem: &str,
    root: &KeylessRoot,
    integrated: u64,
) -> Result<Vec<u8>, VerifyError> {
    let leaf = pem_certificates(leaf_pem)
        .map_err(|e| VerifyError::Untrusted(format!("certificate annotation: {e}")))?
        .into_iter()
        .next()
        .ok_or_else(|| {
            VerifyError::Untrusted("certificate annotation holds no certificate".into())
        })?;
    verify_chain(
        &leaf,
        &[],
        &root.fulcio,
        UnixTime::since_unix_epoch(std::time::Duration::from_secs(integrated)),
    )
    .map_err(|e| match e {
        VerifyError::Untrusted(m) => {
            VerifyError::Untrusted(format!("the certificate does not chain to trustRoot's Fulcio certificates at the bundle's time: {m}"))
        }
        other => other,
    })?;
    Ok(leaf)
}

/// The identity of a keyless signature's certificate: `subject` among its email or URI
/// SANs, and `issuer` as its OIDC issuer.
fn keyless_identity(leaf: &[u8], issuer: &str, subject: &str) -> Result<(), VerifyError> {
    let subjects = san_subjects(leaf)?;
    if !subjects.iter().any(|s| s == subject) {
        return Err(VerifyError::SubjectMismatch {
            found: if subjects.is_empty() {
                "no email or URI SAN".into()
            } else {
                subjects.join(", ")
            },
            wanted: subject.to_string(),
        });
    }
    match oidc_issuer(leaf)? {
        Some(found) if found == issuer => Ok(()),
        found => Err(VerifyError::IssuerMismatch {
            found: found.unwrap_or_else(|| "none".into()),
            wanted: issuer.to_string(),
        }),
    }
}

/// A Sigstore bundle in mode `keyless`: a log entry with a SET by a trust-root Rekor key
/// recording this envelope, the certificate to Fulcio at its integration time, the
/// identity, the signature by the certificate's key.
fn check_keyless_bundle(
    signed: &bundle::Signed,
    root: &KeylessRoot,
    issuer: &str,
    subject: &str,
) -> Result<String, VerifyError> {
    let (leaf, _) = signed.certificates.split_first().ok_or_else(|| {
        VerifyError::Untrusted(
            "Sigstore bundle: signed with a key, not a Fulcio certificate".into(),
        )
    })?;
    let integrated = signed.logged(&root.rekor)?;
    verify_chain(
        leaf,
        &[],
        &root.fulcio,
        UnixTime::since_unix_epoch(std::time::Duration::from_secs(integrated)),
    )?;
    keyless_identity(leaf, issuer, subject)?;
    if !signed.verifies_with(&certificate_key(leaf)?) {
        return Err(VerifyError::Unsatisfied(
            "Sigstore bundle: the signature does not verify with the certificate's key".into(),
        ));
    }
    Ok(subject.to_string())
}

/// The OIDC issuer of a Fulcio certificate: extension 1.3.6.1.4.1.57264.1.8 (a DER
/// UTF8String), else the deprecated 1.3.6.1.4.1.57264.1.1 (the raw string).
fn oidc_issuer(der: &[u8]) -> Result<Option<String>, VerifyError> {
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

/// `hashedrekord` of the payload's SHA-256, this signature, and this certificate.
fn check_rekor_entry(raw: &RawSignature) -> Result<(), VerifyError> {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    let bad = |why: &str| VerifyError::Untrusted(format!("Rekor bundle: {why}"));
    let bundle: serde_json::Value = raw
        .annotations
        .get(BUNDLE_ANNOTATION)
        .ok_or_else(|| bad("missing"))
        .and_then(|b| serde_json::from_str(b).map_err(|_| bad("not JSON")))?;
    let body = bundle
        .pointer("/Payload/body")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| bad("no body"))?;
    let body: serde_json::Value = STANDARD
        .decode(body)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| bad("body is not base64 JSON"))?;
    let field = |path: &str| body.pointer(path).and_then(serde_json::Value::as_str);
    if field("/kind") != Some("hashedrekord") {
        return Err(bad("the log entry is not a hashedrekord"));
    }
    if field("/spec/data/hash/algorithm") != Some("sha256")
        || field("/spec/data/hash/value") != Some(hex(&Sha256::digest(&raw.payload)).as_str())
    {
        return Err(bad("the log entry records another payload"));
    }
    if field("/spec/signature/content") != Some(raw.signature()?) {
        return Err(bad("the log entry records another signature"));
    }
    let logged = field("/spec/signature/publicKey/content")
        .and_then(|c| STANDARD.decode(c).ok())
        .and_then(|pem| pem_certificates(&String::from_utf8_lossy(&pem)).ok())
        .ok_or_else(|| bad("the log entry records no certificate"))?;
    let presented = raw
        .annotations
        .get(CERTIFICATE_ANNOTATION)
        .and_then(|pem| pem_certificates(pem).ok())
        .ok_or_else(|| bad("the signature carries no certificate"))?;
    if logged.is_empty() || logged.first() != presented.first() {
        return Err(bad("the log entry records another certificate"));
    }
    Ok(())
}

/// What [`explain`] found about an image.
#[derive(Clone, Debug)]
pub struct Explained {
    /// The image pinned to the digest its tag names now.
    pub pinned: String,
    /// The verification, refused with its reason when unsigned, badly signed or not a
    /// cache image.
    pub verification: Verification,
    /// The cache image's self-description; `None` when it is not a cache image.
    pub image: Option<crate::image::CacheImage>,
}

/// The verification the controller would reach on `image` (tag or digest) under `policy`
/// (`kubeairunway cache verify`; `controller::decide::verdict` turns it into the
/// controller's `Verified` condition).
pub async fn explain(
    policy: &KernelCachePolicySpec,
    image: &str,
    auth: &RegistryAuth,
    plain_http: Vec<String>,
) -> Result<Explained, String> {
    let puller = crate::oci::Puller::new(auth.clone(), plain_http.clone());
    let digest = puller.resolve(image).await.map_err(|e| e.to_string())?;
    let pinned = crate::oci::pin(image, &digest).map_err(|e| e.to_string())?;
    let verification = match verify(policy, &pinned, auth, plain_http).await {
        Ok(v) => v,
        Err(e) => refused(policy.mode, &e),
    };
    let (verification, image) = match puller.inspect(&pinned).await {
        Ok((_, image)) => (verification, Some(image)),
        Err(e) => (
            Verification {
                verified: false,
                message: Some(format!("not usable: {e}")),
                ..verification
            },
            None,
        ),
    };
    Ok(Explained {
        pinned,
        verification,
        image,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAETJP9cqpUQsn2ggmJniWGjHdlsHzD
JsB89BPhZYch0U0hKANx5TY+ncrm0s8bfJxxHoenAEFhwhuXeb4PqIrtoQ==
-----END PUBLIC KEY-----";

    #[test]
    fn subject_patterns_match_whole_subjects() {
        let re = subject_regex(r"builder@example\.com").unwrap();
        assert!(re.is_match("builder@example.com"));
        assert!(!re.is_match("evil-builder@example.com"));
        assert!(!re.is_match("builder@example.com.evil"));
        let re = subject_regex(r"https://ci\.example\.com/.*|ops@example\.com").unwrap();
        assert!(re.is_match("https://ci.example.com/pipelines/7"));
        assert!(re.is_match("ops@example.com"));
        assert!(!re.is_match("xops@example.com"));
        assert!(!re.is_match("https://ci.example.com.evil/x"));
        assert!(matches!(subject_regex("("), Err(VerifyError::Policy(_))));
    }

    #[test]
    fn fingerprints_public_keys() {
        let fp = key_fingerprint(KEY).unwrap();
        assert!(fp.starts_with("sha256:"));
        assert_eq!(fp.len(), "sha256:".len() + 16);
        assert_eq!(fp, key_fingerprint(&format!("\n{KEY}\n")).unwrap());
        assert!(key_fingerprint("not a key").is_err());
        let cert = "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n";
        assert!(key_fingerprint(cert).is_err());
        assert!(CosignVerificationKey::try_from_pem(KEY.as_bytes()).is_ok());
    }

    #[test]
    fn pem_bundles() {
        assert!(pem_certificates("").unwrap().is_empty());
        assert!(pem_certificates(KEY).is_err());
    }

    #[tokio::test]
    async fn disabled_reports_unverified_without_touching_a_registry() {
        let policy = KernelCachePolicySpec {
            mode: VerificationMode::Disabled,
            ..Default::default()
        };
        let v = verify(
            &policy,
            "nowhere.invalid/x@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            &RegistryAuth::Anonymous,
            vec![],
        )
        .await
        .unwrap();
        assert!(!v.verified);
        assert_eq!(v.message.as_deref(), Some(DISABLED_MESSAGE));
    }

    #[tokio::test]
    async fn refuses_unpinned_references_and_empty_policies() {
        let policy = KernelCachePolicySpec::default();
        let err = verify(
            &policy,
            "example.com/x:latest",
            &RegistryAuth::Anonymous,
            vec![],
        )
        .await
        .unwrap_err();
        assert!(matches!(err, VerifyError::Reference(..)), "{err}");
        let err = verify(
            &policy,
            "example.com/x@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            &RegistryAuth::Anonymous,
            vec![],
        )
        .await
        .unwrap_err();
        assert!(matches!(err, VerifyError::Policy(_)), "{err}");
        assert!(!refused(VerificationMode::Key, &err).verified);
    }
}
