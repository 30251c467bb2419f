//! Cosign signature verification of cache images against a real loopback OCI registry:
//! images signed in the test with the sigstore crate (key pairs) and with certificates
//! from a CA made with rcgen, and interop with the real `cosign` CLI (Debian sid's
//! package, unpacked by `tests/cluster/fetch-cosign.sh`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use flate2::Compression;
use flate2::write::GzEncoder;
use kubeairunway_e2e::cache_images;
use kubeairunway_kernelcache_api::{
    CertificatePolicy, KernelCachePolicySpec, KeylessIdentity, TrustRoot, VerificationMode,
};
use kubeairunway_kernelcache_artifact::oci::{Puller, pin};
use kubeairunway_kernelcache_signing::fetch::{
    BUNDLE_ANNOTATION, CERTIFICATE_ANNOTATION, CHAIN_ANNOTATION, SIGNATURE_ANNOTATION,
    SIMPLE_SIGNING_MEDIA_TYPE,
};
use kubeairunway_kernelcache_signing::verify::{
    DISABLED_MESSAGE, VerifyError, key_fingerprint, refused, verify,
};
use kubeairunway_testcluster::registry::Registry;
use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::{
    IMAGE_CONFIG_MEDIA_TYPE, IMAGE_LAYER_GZIP_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciImageManifest,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use sigstore::cosign::constraint::PrivateKeySigner;
use sigstore::cosign::{Constraint, SignatureLayer};
use sigstore::crypto::SigStoreSigner;
use sigstore::registry::OciReference;

fn start_registry(tag: &str) -> Registry {
    cache_images::start_registry(&format!("verify-{tag}")).unwrap()
}

fn oci() -> Client {
    cache_images::oci_client()
}

/// Push a small image (one gzip tar layer, whose content is `marker`) and return it pinned.
async fn push_image(registry: &Registry, repo_tag: &str, marker: &str) -> String {
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
    let mut header = tar::Header::new_gnu();
    header.set_size(marker.len() as u64);
    header.set_mode(0o644);
    builder
        .append_data(&mut header, "marker", marker.as_bytes())
        .unwrap();
    let layer = builder.into_inner().unwrap().finish().unwrap();
    let reference: Reference = format!("{}/{repo_tag}", registry.addr()).parse().unwrap();
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
    oci()
        .push(
            &reference,
            &[ImageLayer::new(
                layer,
                IMAGE_LAYER_GZIP_MEDIA_TYPE.to_string(),
                None,
            )],
            Config::new(config.to_vec(), IMAGE_CONFIG_MEDIA_TYPE.to_string(), None),
            &RegistryAuth::Anonymous,
            None,
        )
        .await
        .unwrap();
    let puller = Puller::new(RegistryAuth::Anonymous, vec![registry.addr().to_string()]);
    let digest = puller.resolve(&reference.to_string()).await.unwrap();
    pin(&reference.to_string(), &digest).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        write!(s, "{b:02x}").unwrap();
        s
    })
}

fn digest_of(pinned: &str) -> String {
    pinned.split_once('@').unwrap().1.to_string()
}

fn new_signer() -> (SigStoreSigner, String) {
    cache_images::new_signer().unwrap()
}

/// A signed simple-signing layer for `digest` (of the image `pinned` names).
fn signed_layer(signer: SigStoreSigner, pinned: &str, digest: &str) -> SignatureLayer {
    let reference: OciReference = pinned.parse().unwrap();
    let mut layer = SignatureLayer::new_unsigned(&reference, digest).unwrap();
    assert!(
        PrivateKeySigner::new_with_signer(signer)
            .add_constraint(&mut layer)
            .unwrap()
    );
    layer
}

/// Sign `pinned` with sigstore's cosign client, the way `cosign sign --key` does.
async fn sign_with_sigstore(registry: &Registry, pinned: &str, signer: SigStoreSigner) {
    cache_images::sign(registry, pinned, signer).await.unwrap();
}

/// Push a signature object (`sha256-<hex>.sig`) for `pinned` by hand: one simple-signing
/// layer with `payload` and `annotations`. The manifest is serialized with serde_json, as
/// cosign does: oci-client's canonical JSON leaves the newlines of PEM annotations
/// unescaped, which the registry rightly refuses.
async fn push_signature_object(
    pinned: &str,
    payload: Vec<u8>,
    annotations: BTreeMap<String, String>,
) {
    let (repo, digest) = pinned.split_once('@').unwrap();
    let reference: Reference = format!("{repo}:{}.sig", digest.replace(':', "-"))
        .parse()
        .unwrap();
    let layer = ImageLayer::new(
        payload,
        SIMPLE_SIGNING_MEDIA_TYPE.to_string(),
        Some(annotations),
    );
    let config = Config::new(b"{}".to_vec(), IMAGE_CONFIG_MEDIA_TYPE.to_string(), None);
    let client = oci();
    for (data, digest) in [
        (layer.data.clone(), layer.sha256_digest()),
        (config.data.clone(), config.sha256_digest()),
    ] {
        client.push_blob(&reference, data, &digest).await.unwrap();
    }
    let manifest = OciImageManifest::build(&[layer], &config, None);
    client
        .push_manifest_raw(
            &reference,
            serde_json::to_vec(&manifest).unwrap(),
            http::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE),
        )
        .await
        .unwrap();
}

fn key_policy(keys: &[&str]) -> KernelCachePolicySpec {
    KernelCachePolicySpec {
        mode: VerificationMode::Key,
        public_keys: keys.iter().map(ToString::to_string).collect(),
        ..Default::default()
    }
}

async fn check(
    policy: &KernelCachePolicySpec,
    registry: &Registry,
    pinned: &str,
) -> Result<kubeairunway_kernelcache_api::Verification, VerifyError> {
    verify(
        policy,
        pinned,
        &RegistryAuth::Anonymous,
        vec![registry.addr().to_string()],
    )
    .await
}

#[tokio::test]
async fn key_mode_accepts_the_right_key_and_refuses_wrong_keys_and_unsigned_images() {
    let registry = start_registry("key");
    let signed = push_image(&registry, "caches/signed:v1", "signed").await;
    let unsigned = push_image(&registry, "caches/unsigned:v1", "unsigned").await;
    let (signer, public) = new_signer();
    let (_, other_public) = new_signer();
    sign_with_sigstore(&registry, &signed, signer).await;

    // Signed by the key: verified, signer is its fingerprint (also with another key listed).
    let v = check(&key_policy(&[&public]), &registry, &signed)
        .await
        .unwrap();
    assert!(v.verified);
    assert_eq!(v.mode, VerificationMode::Key);
    assert_eq!(v.signer, Some(key_fingerprint(&public).unwrap()));
    let v = check(&key_policy(&[&other_public, &public]), &registry, &signed)
        .await
        .unwrap();
    assert!(v.verified);
    assert_eq!(v.signer, Some(key_fingerprint(&public).unwrap()));

    // A wrong key.
    let err = check(&key_policy(&[&other_public]), &registry, &signed)
        .await
        .unwrap_err();
    assert!(matches!(err, VerifyError::Unsatisfied(_)), "{err}");
    assert!(err.to_string().contains("unsatisfied constraints"), "{err}");
    let status = refused(VerificationMode::Key, &err);
    assert!(!status.verified);

    // No signature at all.
    let err = check(&key_policy(&[&public]), &registry, &unsigned)
        .await
        .unwrap_err();
    assert!(matches!(err, VerifyError::NoSignature(_)), "{err}");
    assert!(err.to_string().contains("no signature found"), "{err}");

    // A signature of another image stored as this image's signature.
    let (signer, public) = new_signer();
    let layer = signed_layer(signer, &unsigned, &digest_of(&signed));
    push_signature_object(
        &unsigned,
        layer.raw_data.clone(),
        [(SIGNATURE_ANNOTATION.to_string(), layer.signature.unwrap())].into(),
    )
    .await;
    let err = check(&key_policy(&[&public]), &registry, &unsigned)
        .await
        .unwrap_err();
    assert!(matches!(err, VerifyError::DigestMismatch { .. }), "{err}");

    // A tampered signature (valid base64, wrong bytes) is not a signature by the key.
    let tampered = push_image(&registry, "caches/tampered:v1", "tampered").await;
    let (signer, public) = new_signer();
    let (other_signer, _) = new_signer();
    let good = signed_layer(signer, &tampered, &digest_of(&tampered));
    let forged = signed_layer(other_signer, &tampered, &digest_of(&tampered));
    assert_eq!(good.raw_data, forged.raw_data);
    push_signature_object(
        &tampered,
        good.raw_data.clone(),
        [(SIGNATURE_ANNOTATION.to_string(), forged.signature.unwrap())].into(),
    )
    .await;
    let err = check(&key_policy(&[&public]), &registry, &tampered)
        .await
        .unwrap_err();
    assert!(matches!(err, VerifyError::Unsatisfied(_)), "{err}");

    // Disabled: nothing checked, nothing verified, said loudly.
    let disabled = KernelCachePolicySpec {
        mode: VerificationMode::Disabled,
        ..Default::default()
    };
    let v = check(&disabled, &registry, &unsigned).await.unwrap();
    assert!(!v.verified);
    assert_eq!(v.mode, VerificationMode::Disabled);
    assert_eq!(v.message.as_deref(), Some(DISABLED_MESSAGE));
}

/// A CA (root, intermediate) and code-signing leaves with given SANs, made with rcgen.
struct Pki {
    root_pem: String,
    intermediate: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} root"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let root = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} intermediate"));
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let intermediate =
            CertifiedIssuer::signed_by(params, KeyPair::generate().unwrap(), &root).unwrap();
        Pki {
            root_pem: root.pem(),
            intermediate,
        }
    }

    /// A leaf for `signer`'s key with the given SANs; returns (leaf PEM, chain PEM).
    fn leaf(&self, signer: &SigStoreSigner, sans: Vec<SanType>) -> (String, String) {
        let private = signer
            .to_sigstore_keypair()
            .unwrap()
            .private_key_to_pem()
            .unwrap();
        let key = KeyPair::from_pem(&private).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "cache signer");
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        let leaf = params.signed_by(&key, &self.intermediate).unwrap();
        (
            leaf.pem(),
            format!("{}{}", self.intermediate.pem(), self.root_pem),
        )
    }
}

/// Sign `pinned` with a certificate for `signer`, cosign `--cert --cert-chain` style.
async fn sign_with_certificate(pinned: &str, signer: SigStoreSigner, leaf: &str, chain: &str) {
    let layer = signed_layer(signer, pinned, &digest_of(pinned));
    push_signature_object(
        pinned,
        layer.raw_data.clone(),
        [
            (SIGNATURE_ANNOTATION.to_string(), layer.signature.unwrap()),
            (CERTIFICATE_ANNOTATION.to_string(), leaf.to_string()),
            (CHAIN_ANNOTATION.to_string(), chain.to_string()),
        ]
        .into(),
    )
    .await;
}

fn cert_policy(ca: &str, pattern: &str) -> KernelCachePolicySpec {
    KernelCachePolicySpec {
        mode: VerificationMode::Certificate,
        certificate: Some(CertificatePolicy {
            ca_bundle: ca.to_string(),
            subject_pattern: pattern.to_string(),
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn certificate_mode_checks_the_chain_the_subject_and_the_signature() {
    let registry = start_registry("cert");
    let pki = Pki::new("cache-ca");
    let rogue = Pki::new("rogue-ca");

    let email = push_image(&registry, "caches/email:v1", "email").await;
    let (signer, _) = new_signer();
    let (leaf, chain) = pki.leaf(
        &signer,
        vec![SanType::Rfc822Name(
            "builder@example.com".try_into().unwrap(),
        )],
    );
    sign_with_certificate(&email, signer, &leaf, &chain).await;

    let v = check(
        &cert_policy(&pki.root_pem, r"builder@example\.com"),
        &registry,
        &email,
    )
    .await
    .unwrap();
    assert!(v.verified);
    assert_eq!(v.mode, VerificationMode::Certificate);
    assert_eq!(v.signer.as_deref(), Some("builder@example.com"));
    // Patterns match whole subjects only.
    for pattern in [
        r"builder@example\.co",
        r"uilder@example\.com",
        r"other@example\.com",
    ] {
        let err = check(&cert_policy(&pki.root_pem, pattern), &registry, &email)
            .await
            .unwrap_err();
        assert!(matches!(err, VerifyError::SubjectMismatch { .. }), "{err}");
    }
    // Another CA is not trusted.
    let err = check(&cert_policy(&rogue.root_pem, ".*"), &registry, &email)
        .await
        .unwrap_err();
    assert!(matches!(err, VerifyError::Untrusted(_)), "{err}");

    // A URI SAN.
    let uri = push_image(&registry, "caches/uri:v1", "uri").await;
    let (signer, _) = new_signer();
    let (leaf, chain) = pki.leaf(
        &signer,
        vec![SanType::URI(
            "https://ci.example.com/pipelines/cache-build"
                .try_into()
                .unwrap(),
        )],
    );
    sign_with_certificate(&uri, signer, &leaf, &chain).await;
    let v = check(
        &cert_policy(&pki.root_pem, r"https://ci\.example\.com/pipelines/.*"),
        &registry,
        &uri,
    )
    .await
    .unwrap();
    assert_eq!(
        v.signer.as_deref(),
        Some("https://ci.example.com/pipelines/cache-build")
    );

    // A certificate from an untrusted CA presenting the trusted CA's root in its chain
    // annotation does not pass either.
    let rogue_signed = push_image(&registry, "caches/rogue:v1", "rogue").await;
    let (signer, _) = new_signer();
    let (leaf, _) = rogue.leaf(
        &signer,
        vec![SanType::Rfc822Name(
            "builder@example.com".try_into().unwrap(),
        )],
    );
    let forged_chain = format!("{}{}", rogue.intermediate.pem(), pki.root_pem);
    sign_with_certificate(&rogue_signed, signer, &leaf, &forged_chain).await;
    let err = check(
        &cert_policy(&pki.root_pem, r"builder@example\.com"),
        &registry,
        &rogue_signed,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, VerifyError::Untrusted(_)), "{err}");

    // A trusted certificate, but the signature was made with another key.
    let mismatched = push_image(&registry, "caches/mismatched:v1", "mismatched").await;
    let (signer, _) = new_signer();
    let (cert_owner, _) = new_signer();
    let (leaf, chain) = pki.leaf(
        &cert_owner,
        vec![SanType::Rfc822Name(
            "builder@example.com".try_into().unwrap(),
        )],
    );
    sign_with_certificate(&mismatched, signer, &leaf, &chain).await;
    let err = check(
        &cert_policy(&pki.root_pem, r"builder@example\.com"),
        &registry,
        &mismatched,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, VerifyError::Unsatisfied(_)), "{err}");

    // A key-only signature (no certificate) and an unsigned image are refused.
    let keyonly = push_image(&registry, "caches/keyonly:v1", "keyonly").await;
    let (signer, _) = new_signer();
    sign_with_sigstore(&registry, &keyonly, signer).await;
    let err = check(&cert_policy(&pki.root_pem, ".*"), &registry, &keyonly)
        .await
        .unwrap_err();
    assert!(matches!(err, VerifyError::Untrusted(_)), "{err}");
    let unsigned = push_image(&registry, "caches/unsigned:v1", "unsigned").await;
    let err = check(&cert_policy(&pki.root_pem, ".*"), &registry, &unsigned)
        .await
        .unwrap_err();
    assert!(matches!(err, VerifyError::NoSignature(_)), "{err}");
}

/// The cosign CLI, unpacked by `tests/cluster/fetch-cosign.sh`; `None` (with the reason)
/// when it cannot be had.
pub(crate) fn cosign() -> Result<PathBuf, String> {
    let bin = kubeairunway_testcluster::cache_dir().join("bin/cosign");
    if bin.is_file() {
        return Ok(bin);
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../cluster/fetch-cosign.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env(
            "KUBEAIRUNWAY_TESTCLUSTER_CACHE",
            kubeairunway_testcluster::cache_dir(),
        )
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if out.status.success() && bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[tokio::test]
async fn a_signature_made_by_the_cosign_cli_verifies() {
    let cosign = match cosign() {
        Ok(bin) => bin,
        Err(reason) if std::env::var_os("CI").is_none() => {
            println!("skipping the cosign CLI interop test (outside CI): {reason}");
            return;
        }
        Err(reason) => panic!("the cosign CLI is needed in CI: {reason}"),
    };
    let registry = start_registry("cosign");
    let pinned = push_image(&registry, "caches/cosigned:v1", "cosigned").await;
    let work = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(&cosign)
            .args(args)
            .current_dir(work.path())
            .env("COSIGN_PASSWORD", "")
            .env("HOME", work.path())
            .env("TUF_ROOT", work.path().join("tuf"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cosign {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["generate-key-pair"]);
    run(&[
        "sign",
        "--key",
        "cosign.key",
        "--tlog-upload=false",
        "--new-bundle-format=false",
        "--use-signing-config=false",
        "--allow-insecure-registry",
        "--allow-http-registry",
        "--yes",
        &pinned,
    ]);
    let public = std::fs::read_to_string(work.path().join("cosign.pub")).unwrap();
    let v = check(&key_policy(&[&public]), &registry, &pinned)
        .await
        .unwrap();
    assert!(v.verified, "{v:?}");
    assert_eq!(v.signer, Some(key_fingerprint(&public).unwrap()));
    let (_, other) = new_signer();
    let err = check(&key_policy(&[&other]), &registry, &pinned)
        .await
        .unwrap_err();
    assert!(matches!(err, VerifyError::Unsatisfied(_)), "{err}");

    // cosign's default output of the day (3.x): a Sigstore bundle (DSSE envelope, public
    // key hint, no log entry offline) in an OCI artifact under the `sha256-<hex>` tag.
    let bundled = push_image(&registry, "caches/cosigned-bundle:v1", "cosigned-bundle").await;
    run(&[
        "sign",
        "--key",
        "cosign.key",
        "--use-signing-config=false",
        "--tlog-upload=false",
        "--allow-insecure-registry",
        "--allow-http-registry",
        "--yes",
        &bundled,
    ]);
    let v = check(&key_policy(&[&public]), &registry, &bundled)
        .await
        .unwrap();
    assert!(v.verified, "{v:?}");
    assert_eq!(v.signer, Some(key_fingerprint(&public).unwrap()));
    let err = check(&key_policy(&[&other]), &registry, &bundled)
        .await
        .unwrap_err();
    assert!(matches!(err, VerifyError::Unsatisfied(_)), "{err}");
    assert!(
        err.to_string()
            .contains("1 Sigstore bundle(s) checked against 1 key(s); the bundle: signed by none of the policy's keys"),
        "{err}"
    );

    // Certificate mode: cosign signs with an imported key and a certificate chain made
    // with rcgen (`--certificate`, `--certificate-chain`).
    let certified = push_image(&registry, "caches/cosigned-cert:v1", "cosigned-cert").await;
    let pki = Pki::new("cosign-ca");
    let (signer, _) = new_signer();
    let (leaf, chain) = pki.leaf(
        &signer,
        vec![SanType::Rfc822Name(
            "builder@example.com".try_into().unwrap(),
        )],
    );
    let private = signer
        .to_sigstore_keypair()
        .unwrap()
        .private_key_to_pem()
        .unwrap();
    std::fs::write(work.path().join("imported.pem"), private.as_bytes()).unwrap();
    std::fs::write(work.path().join("leaf.pem"), &leaf).unwrap();
    std::fs::write(work.path().join("chain.pem"), &chain).unwrap();
    run(&[
        "import-key-pair",
        "--key",
        "imported.pem",
        "--output-key-prefix",
        "imported",
        "--yes",
    ]);
    run(&[
        "sign",
        "--key",
        "imported.key",
        "--certificate",
        "leaf.pem",
        "--certificate-chain",
        "chain.pem",
        "--tlog-upload=false",
        "--new-bundle-format=false",
        "--use-signing-config=false",
        "--allow-insecure-registry",
        "--allow-http-registry",
        "--yes",
        &certified,
    ]);
    // cosign 3.1.1 writes the chain annotation empty here (`dev.sigstore.cosign/chain: ""`),
    // so the CA bundle must hold the intermediate too: every bundle certificate is a trust
    // anchor.
    let ca_bundle = format!("{}{}", pki.intermediate.pem(), pki.root_pem);
    let v = check(
        &cert_policy(&ca_bundle, r"builder@example\.com"),
        &registry,
        &certified,
    )
    .await
    .unwrap();
    assert!(v.verified, "{v:?}");
    assert_eq!(v.signer.as_deref(), Some("builder@example.com"));
    let err = check(
        &cert_policy(&Pki::new("other").root_pem, ".*"),
        &registry,
        &certified,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, VerifyError::Untrusted(_)), "{err}");

    // The same with cosign's default bundle format.
    let certified_bundle = push_image(
        &registry,
        "caches/cosigned-cert-bundle:v1",
        "cosigned-cert-bundle",
    )
    .await;
    run(&[
        "sign",
        "--key",
        "imported.key",
        "--certificate",
        "leaf.pem",
        "--certificate-chain",
        "chain.pem",
        "--use-signing-config=false",
        "--tlog-upload=false",
        "--allow-insecure-registry",
        "--allow-http-registry",
        "--yes",
        &certified_bundle,
    ]);
    let v = check(
        &cert_policy(&ca_bundle, r"builder@example\.com"),
        &registry,
        &certified_bundle,
    )
    .await
    .unwrap();
    assert!(v.verified, "{v:?}");
    assert_eq!(v.signer.as_deref(), Some("builder@example.com"));
    let err = check(
        &cert_policy(&ca_bundle, r"other@example\.com"),
        &registry,
        &certified_bundle,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, VerifyError::SubjectMismatch { .. }), "{err}");
    // A key-signed bundle in certificate mode: refused, saying why.
    let err = check(&cert_policy(&ca_bundle, ".*"), &registry, &bundled)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("Sigstore bundle: signed with a key, not a certificate"),
        "{err}"
    );
}

/// A Fulcio-style CA and Rekor key made in the test, for offline keyless verification.
struct Sigstore {
    fulcio: CertifiedIssuer<'static, KeyPair>,
    rekor: SigStoreSigner,
    rekor_pem: String,
}

const ISSUER_OID: &[u64] = &[1, 3, 6, 1, 4, 1, 57264, 1, 1];

impl Sigstore {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} fulcio"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let fulcio = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let (rekor, rekor_pem) = new_signer();
        Sigstore {
            fulcio,
            rekor,
            rekor_pem,
        }
    }

    fn policy(&self, issuer: &str, subject: &str) -> KernelCachePolicySpec {
        KernelCachePolicySpec {
            mode: VerificationMode::Keyless,
            keyless: Some(KeylessIdentity {
                issuer: issuer.to_string(),
                subject: subject.to_string(),
            }),
            trust_root: Some(TrustRoot {
                fulcio_certificates: vec![self.fulcio.pem()],
                rekor_keys: vec![self.rekor_pem.clone()],
            }),
            ..Default::default()
        }
    }

    /// A Fulcio-style leaf for `signer`: email SAN, OIDC issuer extension, code signing.
    fn leaf(&self, signer: &SigStoreSigner, email: &str, issuer: &str) -> String {
        let private = signer
            .to_sigstore_keypair()
            .unwrap()
            .private_key_to_pem()
            .unwrap();
        let key = KeyPair::from_pem(&private).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![SanType::Rfc822Name(email.try_into().unwrap())];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        params.custom_extensions = vec![rcgen::CustomExtension::from_oid_content(
            ISSUER_OID,
            issuer.as_bytes().to_vec(),
        )];
        params.signed_by(&key, &self.fulcio).unwrap().pem()
    }

    /// A Rekor bundle for a hashedrekord of (payload, signature, certificate), its SET
    /// signed with this test Rekor key.
    fn bundle(&self, payload: &[u8], signature: &str, leaf_pem: &str) -> String {
        use base64::Engine as _;
        use base64::engine::general_purpose::STANDARD;
        use sha2::Digest as _;
        let body = serde_json::json!({
            "apiVersion": "0.0.1",
            "kind": "hashedrekord",
            "spec": {
                "data": {"hash": {"algorithm": "sha256", "value": hex(&sha2::Sha256::digest(payload))}},
                "signature": {"content": signature, "publicKey": {"content": STANDARD.encode(leaf_pem)}}
            }
        });
        let body = STANDARD.encode(serde_json::to_vec(&body).unwrap());
        let log_id = hex(&sha2::Sha256::digest(
            self.rekor
                .to_sigstore_keypair()
                .unwrap()
                .public_key_to_der()
                .unwrap(),
        ));
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        // RFC 8785 canonical JSON of the payload (keys sorted; plain strings and integers).
        let canonical = format!(
            r#"{{"body":"{body}","integratedTime":{time},"logID":"{log_id}","logIndex":42}}"#
        );
        let set = STANDARD.encode(self.rekor.sign(canonical.as_bytes()).unwrap());
        serde_json::json!({
            "SignedEntryTimestamp": set,
            "Payload": {"body": body, "integratedTime": time, "logIndex": 42, "logID": log_id}
        })
        .to_string()
    }
}

/// Sign `pinned` keyless-style: Fulcio-style certificate plus a Rekor bundle. With
/// `bundle_for`, the bundle records that other payload instead (a replayed entry).
async fn sign_keyless(
    pinned: &str,
    sigstore: &Sigstore,
    bundle_from: &Sigstore,
    email: &str,
    issuer: &str,
    bundle_for: Option<&[u8]>,
) {
    let (signer, _) = new_signer();
    let leaf = sigstore.leaf(&signer, email, issuer);
    let layer = signed_layer(signer, pinned, &digest_of(pinned));
    let signature = layer.signature.clone().unwrap();
    let bundle = bundle_from.bundle(bundle_for.unwrap_or(&layer.raw_data), &signature, &leaf);
    push_signature_object(
        pinned,
        layer.raw_data.clone(),
        [
            (SIGNATURE_ANNOTATION.to_string(), signature),
            (CERTIFICATE_ANNOTATION.to_string(), leaf),
            (BUNDLE_ANNOTATION.to_string(), bundle),
        ]
        .into(),
    )
    .await;
}

#[tokio::test]
async fn keyless_mode_checks_fulcio_rekor_issuer_and_subject_offline() {
    let registry = start_registry("keyless");
    let sigstore = Sigstore::new("test");
    let rogue = Sigstore::new("rogue");
    let (issuer, subject) = ("https://token.example.com", "builder@example.com");
    let policy = sigstore.policy(issuer, subject);

    let good = push_image(&registry, "caches/keyless:v1", "keyless").await;
    sign_keyless(&good, &sigstore, &sigstore, subject, issuer, None).await;
    let v = check(&policy, &registry, &good).await.unwrap();
    assert!(v.verified, "{v:?}");
    assert_eq!(v.mode, VerificationMode::Keyless);
    assert_eq!(v.signer.as_deref(), Some(subject));

    let err = check(
        &sigstore.policy(issuer, "other@example.com"),
        &registry,
        &good,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, VerifyError::SubjectMismatch { .. }), "{err}");
    let err = check(
        &sigstore.policy("https://evil.example.com", subject),
        &registry,
        &good,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, VerifyError::IssuerMismatch { .. }), "{err}");

    // A certificate from another CA.
    let rogue_cert = push_image(&registry, "caches/rogue-cert:v1", "rogue-cert").await;
    sign_keyless(&rogue_cert, &rogue, &sigstore, subject, issuer, None).await;
    let err = check(&policy, &registry, &rogue_cert).await.unwrap_err();
    assert!(matches!(err, VerifyError::Untrusted(_)), "{err}");

    // A bundle signed by another Rekor key.
    let rogue_log = push_image(&registry, "caches/rogue-log:v1", "rogue-log").await;
    sign_keyless(&rogue_log, &sigstore, &rogue, subject, issuer, None).await;
    let err = check(&policy, &registry, &rogue_log).await.unwrap_err();
    assert!(matches!(err, VerifyError::Untrusted(_)), "{err}");

    // A genuine bundle of another entry.
    let replayed = push_image(&registry, "caches/replayed:v1", "replayed").await;
    sign_keyless(
        &replayed,
        &sigstore,
        &sigstore,
        subject,
        issuer,
        Some(b"another payload"),
    )
    .await;
    let err = check(&policy, &registry, &replayed).await.unwrap_err();
    assert!(
        matches!(&err, VerifyError::Untrusted(m) if m.contains("Rekor bundle")),
        "{err}"
    );

    // A key-only signature and an unsigned image.
    let keyonly = push_image(&registry, "caches/keyonly:v1", "keyonly").await;
    let (signer, _) = new_signer();
    sign_with_sigstore(&registry, &keyonly, signer).await;
    let err = check(&policy, &registry, &keyonly).await.unwrap_err();
    assert!(matches!(err, VerifyError::Untrusted(_)), "{err}");
    let unsigned = push_image(&registry, "caches/unsigned:v1", "unsigned").await;
    let err = check(&policy, &registry, &unsigned).await.unwrap_err();
    assert!(matches!(err, VerifyError::NoSignature(_)), "{err}");
}

/// Push a Sigstore bundle for `pinned` the way cosign 3 stores one on a registry without
/// the referrers API: an artifact manifest (empty config, the bundle as its one layer,
/// `subject` the image) listed in an image index under the tag `sha256-<hex>`.
async fn push_bundle(pinned: &str, bundle: &serde_json::Value) {
    use sha2::Digest as _;
    let (repo, digest) = pinned.split_once('@').unwrap();
    let client = oci();
    let by_digest = |d: &str| -> Reference { format!("{repo}@{d}").parse().unwrap() };
    let sha = |b: &[u8]| format!("sha256:{}", hex(&sha2::Sha256::digest(b)));
    let layer = serde_json::to_vec(bundle).unwrap();
    let empty = b"{}".to_vec();
    for data in [&layer, &empty] {
        client
            .push_blob(&by_digest(digest), data.clone(), &sha(data))
            .await
            .unwrap();
    }
    let artifact = "application/vnd.dev.sigstore.bundle.v0.3+json";
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_IMAGE_MEDIA_TYPE,
        "artifactType": artifact,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "size": 2, "digest": sha(&empty)},
        "layers": [{"mediaType": artifact, "size": layer.len(), "digest": sha(&layer)}],
        "subject": {"mediaType": OCI_IMAGE_MEDIA_TYPE, "size": 1, "digest": digest},
    }))
    .unwrap();
    let manifest_digest = sha(&manifest);
    client
        .push_manifest_raw(
            &by_digest(&manifest_digest),
            manifest.clone(),
            http::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE),
        )
        .await
        .unwrap();
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": OCI_IMAGE_MEDIA_TYPE, "size": manifest.len(),
                       "digest": manifest_digest, "artifactType": artifact}],
    }))
    .unwrap();
    let tag: Reference = format!("{repo}:{}", digest.replace(':', "-"))
        .parse()
        .unwrap();
    client
        .push_manifest_raw(
            &tag,
            index,
            http::HeaderValue::from_static("application/vnd.oci.image.index.v1+json"),
        )
        .await
        .unwrap();
}

impl Sigstore {
    /// A keyless Sigstore bundle (v0.3) for `pinned`: a Fulcio-style certificate, the DSSE
    /// envelope cosign signs, and its `dsse` log entry with a SET by `log`'s Rekor key.
    fn keyless_bundle(
        &self,
        log: &Sigstore,
        pinned: &str,
        email: &str,
        issuer: &str,
    ) -> serde_json::Value {
        use base64::Engine as _;
        use base64::engine::general_purpose::STANDARD;
        use sha2::Digest as _;
        let (signer, _) = new_signer();
        let leaf = self.leaf(&signer, email, issuer);
        let leaf_der = kubeairunway_kernelcache_signing::verify::pem_certificates(&leaf)
            .unwrap()
            .remove(0);
        let hex_digest = digest_of(pinned).trim_start_matches("sha256:").to_string();
        let payload = serde_json::to_vec(&serde_json::json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"digest": {"sha256": hex_digest}}],
            "predicateType": "https://sigstore.dev/cosign/sign/v1",
            "predicate": {},
        }))
        .unwrap();
        let payload_type = "application/vnd.in-toto+json";
        let signature = signer
            .sign(&kubeairunway_kernelcache_signing::bundle::pae(
                payload_type,
                &payload,
            ))
            .unwrap();
        let body = serde_json::to_vec(&serde_json::json!({
            "apiVersion": "0.0.1", "kind": "dsse",
            "spec": {
                "payloadHash": {"algorithm": "sha256", "value": hex(&sha2::Sha256::digest(&payload))},
                "signatures": [{"signature": STANDARD.encode(&signature), "verifier": STANDARD.encode(&leaf)}],
            },
        }))
        .unwrap();
        let key_id = sha2::Sha256::digest(
            log.rekor
                .to_sigstore_keypair()
                .unwrap()
                .public_key_to_der()
                .unwrap(),
        );
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let canonical = format!(
            r#"{{"body":"{}","integratedTime":{time},"logID":"{}","logIndex":7}}"#,
            STANDARD.encode(&body),
            hex(&key_id)
        );
        let set = log.rekor.sign(canonical.as_bytes()).unwrap();
        serde_json::json!({
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {
                "certificate": {"rawBytes": STANDARD.encode(&leaf_der)},
                "tlogEntries": [{
                    "logIndex": "7",
                    "logId": {"keyId": STANDARD.encode(key_id)},
                    "kindVersion": {"kind": "dsse", "version": "0.0.1"},
                    "integratedTime": time.to_string(),
                    "inclusionPromise": {"signedEntryTimestamp": STANDARD.encode(&set)},
                    "canonicalizedBody": STANDARD.encode(&body),
                }],
            },
            "dsseEnvelope": {
                "payload": STANDARD.encode(&payload),
                "payloadType": payload_type,
                "signatures": [{"sig": STANDARD.encode(&signature)}],
            },
        })
    }
}

#[tokio::test]
async fn keyless_sigstore_bundles_with_their_log_entry_verify_offline() {
    let registry = start_registry("keyless-bundle");
    let sigstore = Sigstore::new("test");
    let rogue = Sigstore::new("rogue");
    let (issuer, subject) = ("https://token.example.com", "builder@example.com");
    let policy = sigstore.policy(issuer, subject);

    let good = push_image(&registry, "caches/keyless-bundle:v1", "keyless-bundle").await;
    push_bundle(
        &good,
        &sigstore.keyless_bundle(&sigstore, &good, subject, issuer),
    )
    .await;
    let v = check(&policy, &registry, &good).await.unwrap();
    assert!(v.verified, "{v:?}");
    assert_eq!(v.signer.as_deref(), Some(subject));
    let err = check(
        &sigstore.policy(issuer, "other@example.com"),
        &registry,
        &good,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, VerifyError::SubjectMismatch { .. }), "{err}");
    let err = check(
        &sigstore.policy("https://evil.example.com", subject),
        &registry,
        &good,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, VerifyError::IssuerMismatch { .. }), "{err}");

    // A log entry signed by another Rekor key, a certificate from another CA.
    let rogue_log = push_image(&registry, "caches/keyless-rogue-log:v1", "rogue-log").await;
    push_bundle(
        &rogue_log,
        &sigstore.keyless_bundle(&rogue, &rogue_log, subject, issuer),
    )
    .await;
    let err = check(&policy, &registry, &rogue_log).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("SET does not verify with a trustRoot Rekor key"),
        "{err}"
    );
    let rogue_ca = push_image(&registry, "caches/keyless-rogue-ca:v1", "rogue-ca").await;
    push_bundle(
        &rogue_ca,
        &rogue.keyless_bundle(&sigstore, &rogue_ca, subject, issuer),
    )
    .await;
    let err = check(&policy, &registry, &rogue_ca).await.unwrap_err();
    assert!(matches!(err, VerifyError::Untrusted(_)), "{err}");

    // A bundle of another image stored as this image's.
    let other = push_image(&registry, "caches/keyless-other:v1", "other").await;
    let replayed = push_image(&registry, "caches/keyless-replayed:v1", "replayed").await;
    push_bundle(
        &replayed,
        &sigstore.keyless_bundle(&sigstore, &other, subject, issuer),
    )
    .await;
    let err = check(&policy, &registry, &replayed).await.unwrap_err();
    assert!(matches!(err, VerifyError::DigestMismatch { .. }), "{err}");
}
