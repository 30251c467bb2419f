//! Cosign signature verification of a pinned cache image under a `KernelCachePolicySpec`.
//!
//! The signature is the cosign "simple signing" object stored under the tag
//! `sha256-<hex>.sig` next to the image. Every mode checks that the signed payload names
//! the pinned digest; what makes a signature trusted depends on the mode:
//!
//! - `key`: signed by one of the policy's public keys (sigstore's cosign client and
//!   `PublicKeyVerifier` constraint). The signer is the key's fingerprint.
//! - `certificate`: the layer carries a certificate (and optionally a chain) in cosign's
//!   `dev.sigstore.cosign/certificate` and `dev.sigstore.cosign/chain` annotations; the
//!   certificate must chain to the policy's CA bundle (rustls-webpki, now; every bundle
//!   certificate is a trust anchor, and the chain annotation supplies intermediates; the
//!   cosign 3.1.1 CLI leaves that annotation empty, so list intermediates in the bundle
//!   for its signatures), its email or
//!   URI SAN must fully match the subject pattern, and the signature must verify with the
//!   certificate's key. No network beyond the registry.
//! - `keyless`: a Fulcio certificate plus a Rekor bundle (`dev.sigstore.cosign/bundle`),
//!   checked offline by sigstore against the policy's trust root (the bundle's SET with a
//!   Rekor key named by its log ID, the SHA-256 of the key; the certificate against the
//!   Fulcio certificates, code signing, with the bundle's integration time inside its
//!   validity); we then check that the log entry is a `hashedrekord` of this payload,
//!   signature and certificate (sigstore checks the SET only), compare the OIDC issuer
//!   (extension 1.3.6.1.4.1.57264.1.1, what sigstore reads; not yet .8) and the subject
//!   (the certificate's first email or URI SAN) exactly, and check the signature with the
//!   certificate's key. Not checked: Rekor inclusion proofs and CT SCTs (as with
//!   `cosign verify --offline` on a bundle's SET).
//! - `disabled`: nothing is checked and nothing is reported verified.
//!
//! `verify` returns `Ok` only for a signature that satisfied the policy (or for
//! `disabled`, with `verified: false`); every refusal is an error with its reason, which
//! [`refused`] turns into the status to show.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use rustls_pki_types::{CertificateDer, UnixTime};
use sha2::{Digest as _, Sha256};
use sigstore::cosign::verification_constraint::{PublicKeyVerifier, VerificationConstraintVec};
use sigstore::cosign::{ClientBuilder, CosignCapabilities as _, SignatureLayer};
use sigstore::crypto::{CosignVerificationKey, Signature};
use sigstore::registry::{Auth, OciReference};
use sigstore::trust::ManualTrustRoot;

use crate::api::{KernelCachePolicySpec, Verification, VerificationMode};

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
const MAX_SIGNATURES: usize = 64;

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
    /// The registry failed, or the signature object is malformed.
    #[error("registry: {0}")]
    Registry(String),
}

/// The status to show for a refused image.
pub fn refused(mode: VerificationMode, error: &VerifyError) -> Verification {
    Verification {
        mode,
        verified: false,
        signer: None,
        message: Some(error.to_string()),
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
    let reference: Reference = pinned.parse().map_err(|e: oci_client::ParseError| {
        VerifyError::Reference(pinned.into(), e.to_string())
    })?;
    let digest = reference
        .digest()
        .ok_or_else(|| VerifyError::Reference(pinned.into(), "not pinned to a digest".into()))?
        .to_string();
    let signer = match policy.mode {
        VerificationMode::Key => verify_key(policy, &reference, &digest, auth, plain_http).await?,
        VerificationMode::Certificate => {
            verify_certificate(policy, &reference, &digest, auth, plain_http).await?
        }
        VerificationMode::Keyless => {
            verify_keyless(policy, &reference, &digest, auth, plain_http).await?
        }
        VerificationMode::Disabled => {
            return Ok(Verification {
                mode: VerificationMode::Disabled,
                verified: false,
                signer: None,
                message: Some(DISABLED_MESSAGE.to_string()),
            });
        }
    };
    Ok(Verification {
        mode: policy.mode,
        verified: true,
        signer: Some(signer),
        message: None,
    })
}

// --- key -------------------------------------------------------------------------------

async fn verify_key(
    policy: &KernelCachePolicySpec,
    reference: &Reference,
    digest: &str,
    auth: &RegistryAuth,
    plain_http: Vec<String>,
) -> Result<String, VerifyError> {
    if policy.public_keys.is_empty() {
        return Err(VerifyError::Policy("mode key needs publicKeys".into()));
    }
    let mut keys = Vec::new();
    for (i, pem) in policy.public_keys.iter().enumerate() {
        let verifier = PublicKeyVerifier::try_from(pem.as_bytes())
            .map_err(|e| VerifyError::Policy(format!("publicKeys[{i}]: {e}")))?;
        keys.push((key_fingerprint(pem)?, verifier));
    }
    let layers = sigstore_layers(reference, digest, auth, plain_http.clone(), None).await?;
    if layers.is_empty() {
        // sigstore drops what it cannot trust; say precisely why there is nothing.
        return Err(diagnose_empty(reference, digest, auth, plain_http).await);
    }
    for (fingerprint, verifier) in keys {
        let constraints: VerificationConstraintVec = vec![Box::new(verifier)];
        if sigstore::cosign::verify_constraints(&layers, constraints.iter()).is_ok() {
            return Ok(fingerprint);
        }
    }
    Err(VerifyError::Unsatisfied(format!(
        "{} signature(s) checked against {} key(s)",
        layers.len(),
        policy.public_keys.len()
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

async fn sigstore_layers(
    reference: &Reference,
    digest: &str,
    auth: &RegistryAuth,
    plain_http: Vec<String>,
    trust_root: Option<&ManualTrustRoot<'_>>,
) -> Result<Vec<SignatureLayer>, VerifyError> {
    let config = sigstore::registry::ClientConfig {
        protocol: sigstore::registry::ClientProtocol::HttpsExcept(plain_http),
        ..Default::default()
    };
    let mut builder = ClientBuilder::default().with_oci_client_config(config);
    if let Some(root) = trust_root {
        builder = builder
            .with_trust_repository(root)
            .map_err(|e| VerifyError::Policy(format!("trustRoot: {e}")))?;
    }
    let mut client = builder
        .build()
        .map_err(|e| VerifyError::Registry(format!("cosign client: {e}")))?;
    let image = OciReference::with_digest(
        reference.registry().to_string(),
        reference.repository().to_string(),
        digest.to_string(),
    );
    let layers = client
        .trusted_signature_layers(&Auth::from(auth), &image)
        .await
        .map_err(|e| VerifyError::Registry(e.to_string()))?;
    // Belt and braces: every layer must sign the pinned digest.
    for layer in &layers {
        let signed = &layer.simple_signing.critical.image.docker_manifest_digest;
        if signed != digest {
            return Err(VerifyError::DigestMismatch {
                signed: signed.clone(),
                pinned: digest.to_string(),
            });
        }
    }
    Ok(layers)
}

/// Why sigstore found no usable signature layer: none at all, or one for another digest.
async fn diagnose_empty(
    reference: &Reference,
    digest: &str,
    auth: &RegistryAuth,
    plain_http: Vec<String>,
) -> VerifyError {
    match fetch_signatures(reference, digest, auth, plain_http).await {
        Ok(_) => VerifyError::Unsatisfied("no signature layer could be trusted".into()),
        Err(e) => e,
    }
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

/// Fetch the `sha256-<hex>.sig` manifest and its simple-signing layers; each layer is
/// checked against its digest and its payload must name `digest`.
async fn fetch_signatures(
    reference: &Reference,
    digest: &str,
    auth: &RegistryAuth,
    plain_http: Vec<String>,
) -> Result<Vec<RawSignature>, VerifyError> {
    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(plain_http),
        ..ClientConfig::default()
    });
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
    let (manifest, _) = match client.pull_image_manifest(&sig_ref, auth).await {
        Ok(m) => m,
        Err(e) if manifest_unknown(&e) => return Err(VerifyError::NoSignature(pinned)),
        Err(e) => return Err(VerifyError::Registry(format!("fetching {sig_ref}: {e}"))),
    };
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
        if layer.size > 1 << 20 {
            return Err(VerifyError::Registry(format!(
                "signature layer of {} bytes is implausibly large",
                layer.size
            )));
        }
        let mut payload = Vec::new();
        client
            .pull_blob(&sig_ref, layer, &mut payload)
            .await
            .map_err(|e| VerifyError::Registry(format!("signature layer: {e}")))?;
        let actual = format!("sha256:{}", hex(&Sha256::digest(&payload)));
        if actual != layer.digest {
            return Err(VerifyError::Registry(format!(
                "signature layer content is {actual}, its descriptor says {}",
                layer.digest
            )));
        }
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

fn manifest_unknown(e: &oci_client::errors::OciDistributionError) -> bool {
    use oci_client::errors::{OciDistributionError, OciErrorCode};
    match e {
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .any(|e| e.code == OciErrorCode::ManifestUnknown),
        _ => false,
    }
}

// --- certificate --------------------------------------------------------------------------

async fn verify_certificate(
    policy: &KernelCachePolicySpec,
    reference: &Reference,
    digest: &str,
    auth: &RegistryAuth,
    plain_http: Vec<String>,
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
    let signatures = fetch_signatures(reference, digest, auth, plain_http).await?;
    // Report the most telling failure when no signature passes.
    let mut failure: Option<VerifyError> = None;
    for sig in &signatures {
        match check_certificate_signature(sig, &anchors_der, &pattern, &cert_policy.subject_pattern)
        {
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
    let key = certificate_key(&leaf)?;
    key.verify_signature(
        Signature::Base64Encoded(sig.signature()?.as_bytes()),
        &sig.payload,
    )
    .map_err(|e| {
        VerifyError::Unsatisfied(format!(
            "the signature does not verify with the certificate's key: {e}"
        ))
    })?;
    Ok(subject.clone())
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

async fn verify_keyless(
    policy: &KernelCachePolicySpec,
    reference: &Reference,
    digest: &str,
    auth: &RegistryAuth,
    plain_http: Vec<String>,
) -> Result<String, VerifyError> {
    let identity = policy.keyless.as_ref().ok_or_else(|| {
        VerifyError::Policy("mode keyless needs keyless.issuer and keyless.subject".into())
    })?;
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
        // Rekor names its keys by the hex SHA-256 of the DER public key (the log ID).
        rekor.insert(hex(&Sha256::digest(&block.contents)), block.contents);
    }
    if fulcio.is_empty() || rekor.is_empty() {
        return Err(VerifyError::Policy(
            "trustRoot needs at least one Fulcio certificate and one Rekor key".into(),
        ));
    }
    let trust = ManualTrustRoot {
        fulcio_certs: fulcio
            .iter()
            .map(|d| CertificateDer::from(d.clone()))
            .collect(),
        rekor_keys: rekor,
        ctfe_keys: BTreeMap::new(),
    };
    let layers = sigstore_layers(reference, digest, auth, plain_http.clone(), Some(&trust)).await?;
    if layers.is_empty() {
        return Err(
            match diagnose_empty(reference, digest, auth, plain_http).await {
                VerifyError::Unsatisfied(_) => VerifyError::Untrusted(
                    "no signature with a Rekor bundle signed by a trustRoot Rekor key".into(),
                ),
                e => e,
            },
        );
    }
    // sigstore checks the bundle's SET but not that the log entry is about this signature;
    // the raw layers give the certificate and bundle to compare with.
    let raws = fetch_signatures(reference, digest, auth, plain_http).await?;
    let mut failure: Option<VerifyError> = None;
    for layer in &layers {
        let raw = raws.iter().find(|r| {
            r.payload == layer.raw_data
                && r.annotations.get(SIGNATURE_ANNOTATION) == layer.signature.as_ref()
        });
        let result =
            check_keyless_layer(layer, &identity.issuer, &identity.subject).and_then(|subject| {
                let raw = raw.ok_or_else(|| {
                    VerifyError::Untrusted("the signature layer changed while verifying".into())
                })?;
                check_rekor_entry(raw)?;
                Ok(subject)
            });
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

/// The Rekor entry of a (SET-verified) bundle must record this signature: a
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

fn check_keyless_layer(
    layer: &SignatureLayer,
    issuer: &str,
    subject: &str,
) -> Result<String, VerifyError> {
    use sigstore::cosign::signature_layers::CertificateSubject;
    // sigstore sets certificate_signature only for a certificate that chains to the
    // Fulcio CAs at the time of a Rekor bundle whose SET verified with a trusted key.
    let Some(cert) = &layer.certificate_signature else {
        return Err(VerifyError::Untrusted(
            "no Fulcio certificate with a verified Rekor bundle (certificate or bundle missing, not chaining to trustRoot, or bundle not signed by a trusted Rekor key)".into(),
        ));
    };
    let found_subject = match &cert.subject {
        CertificateSubject::Email(s) | CertificateSubject::Uri(s) => s.clone(),
    };
    if found_subject != subject {
        return Err(VerifyError::SubjectMismatch {
            found: found_subject,
            wanted: subject.to_string(),
        });
    }
    match &cert.issuer {
        Some(found) if found == issuer => {}
        found => {
            return Err(VerifyError::IssuerMismatch {
                found: found.clone().unwrap_or_else(|| "none".into()),
                wanted: issuer.to_string(),
            });
        }
    }
    let signature = layer
        .signature
        .as_deref()
        .ok_or_else(|| VerifyError::Unsatisfied("layer without signature".into()))?;
    cert.verification_key
        .verify_signature(
            Signature::Base64Encoded(signature.as_bytes()),
            &layer.raw_data,
        )
        .map_err(|e| {
            VerifyError::Unsatisfied(format!(
                "the signature does not verify with the certificate's key: {e}"
            ))
        })?;
    Ok(found_subject)
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
        assert!(PublicKeyVerifier::try_from(KEY.as_bytes()).is_ok());
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
