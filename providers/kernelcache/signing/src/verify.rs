//! Cosign signature verification of a pinned cache image under a `KernelCachePolicySpec`.
//!
//! The signature is the cosign "simple signing" object stored under the tag
//! `sha256-<hex>.sig` next to the image, read with the bounded registry client
//! ([`crate::fetch`]: at most [`MAX_SIGNATURES`] layers of at most 1 MiB, each checked
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

use oci_client::Reference;
use oci_client::secrets::RegistryAuth;
use rustls_pki_types::UnixTime;
use sigstore::crypto::{CosignVerificationKey, Signature};

use crate::bundle;
use crate::error::first_passing;
use crate::fetch::{CERTIFICATE_ANNOTATION, CHAIN_ANNOTATION, RawSignature, fetch_all};
use crate::keyless::verify_keyless;
use crate::x509::{certificate_key, matching_subject, san_subjects, verify_chain};
use kubeairunway_kernelcache_api::{KernelCachePolicySpec, Verification, VerificationMode};
use kubeairunway_kernelcache_artifact::registry::{self, Timeouts};

pub use crate::error::VerifyError;
pub use crate::fetch::{MAX_SIGNATURE_BYTES, MAX_SIGNATURES, SIMPLE_SIGNING_MEDIA_TYPE};
pub use crate::x509::{key_fingerprint, pem_certificates, subject_regex};

/// The message of mode `disabled`.
pub const DISABLED_MESSAGE: &str = "signature verification disabled by policy (development only)";

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
    // The most telling failure is reported when no signature passes.
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
    first_passing(results, digest)
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
    sig.verify_by_certificate(&leaf)?;
    Ok(subject.clone())
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

/// What [`explain`] found about an image.
#[derive(Clone, Debug)]
pub struct Explained {
    /// The image pinned to the digest its tag names now.
    pub pinned: String,
    /// The verification, refused with its reason when unsigned, badly signed or not a
    /// cache image.
    pub verification: Verification,
    /// The cache image's self-description; `None` when it is not a cache image.
    pub image: Option<kubeairunway_kernelcache_artifact::image::CacheImage>,
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
    let puller =
        kubeairunway_kernelcache_artifact::oci::Puller::new(auth.clone(), plain_http.clone());
    let digest = puller.resolve(image).await.map_err(|e| e.to_string())?;
    let pinned =
        kubeairunway_kernelcache_artifact::oci::pin(image, &digest).map_err(|e| e.to_string())?;
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
