//! Mode `keyless`: a Fulcio certificate and a Rekor log entry, checked offline against
//! the policy's trust root (the Rekor SET with a key named by its log ID; the certificate
//! against the Fulcio certificates at the entry's integration time; the entry must record
//! this payload, signature and certificate), then the OIDC issuer and subject, then the
//! signature with the certificate's key. Not checked: Rekor inclusion proofs and CT SCTs,
//! as with `cosign verify --offline` on a bundle's SET.

use std::collections::BTreeMap;

use oci_client::Reference;
use rustls_pki_types::UnixTime;
use sha2::{Digest as _, Sha256};
use sigstore::crypto::CosignVerificationKey;

use crate::bundle;
use crate::error::{VerifyError, first_passing};
use crate::fetch::{BUNDLE_ANNOTATION, CERTIFICATE_ANNOTATION, RawSignature, fetch_all};
use crate::x509::{certificate_key, oidc_issuer, pem_certificates, san_subjects, verify_chain};
use kubeairunway_kernelcache_api::KernelCachePolicySpec;
use kubeairunway_kernelcache_artifact::registry::{self, hex};

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

pub(crate) async fn verify_keyless(
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
    let results = found
        .legacy
        .iter()
        .map(|sig| check_keyless_signature(sig, &root, &identity.issuer, &identity.subject))
        .chain(found.bundles.into_iter().map(|b| {
            b.and_then(|signed| {
                check_keyless_bundle(&signed, &root, &identity.issuer, &identity.subject)
            })
        }));
    first_passing(results, digest)
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
    sig.verify_by_certificate(&leaf)?;
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
