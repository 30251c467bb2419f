//! Signing a cache image with a cosign key (`kubeairunway cache build --key`), in either
//! of the two formats the controller verifies ([`crate::verify`]):
//!
//! - [`Format::Bundle`], what cosign 3 writes by default: a Sigstore bundle v0.3 (a DSSE
//!   envelope of an in-toto statement with predicate type
//!   `https://sigstore.dev/cosign/sign/v1` whose subject is the image digest, and the
//!   key's hint as verification material; no transparency-log entry) stored as an OCI
//!   artifact whose `subject` is the image: listed by a registry with the referrers API,
//!   else added to the image index under the fallback tag `sha256-<hex>`, laid out as
//!   cosign lays it out (upstream facts: docs/upstream.md#cosign);
//! - [`Format::Legacy`]: cosign's simple-signing object under the tag `sha256-<hex>.sig`
//!   (`cosign sign --new-bundle-format=false`), through the sigstore crate's cosign client.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use oci_client::Reference;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use sigstore::crypto::SigStoreSigner;

use crate::bundle::{COSIGN_SIGN_PREDICATE, IN_TOTO_PAYLOAD_TYPE, pae};
use crate::error::BuildError;
use kubeairunway_kernelcache_artifact::registry::{self, Timeouts, hex};

/// The bundle media type (and artifact type) written.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The OCI empty descriptor's media type (the artifact's config).
const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// A signature format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    /// The Sigstore bundle cosign 3 writes by default (an OCI referrer of the image).
    #[default]
    Bundle,
    /// cosign's legacy simple-signing object (`sha256-<hex>.sig`).
    Legacy,
}

/// Sign `pinned` (`registry/repo@sha256:...`) with a cosign private key (PEM, encrypted
/// with `password` as `cosign generate-key-pair` writes it, or not) in `format`.
pub async fn sign(
    pinned: &str,
    key_pem: &[u8],
    password: &[u8],
    auth: &RegistryAuth,
    plain_http: Vec<String>,
    format: Format,
) -> Result<(), BuildError> {
    use sigstore::crypto::SigningScheme;
    use sigstore::crypto::signing_key::SigStoreKeyPair;
    let err = |e: &dyn std::fmt::Display| BuildError::Registry(format!("signing {pinned}: {e}"));
    let pair = SigStoreKeyPair::from_encrypted_pem(key_pem, password)
        .or_else(|_| SigStoreKeyPair::from_pem(key_pem))
        .map_err(|e| err(&e))?;
    let signer = pair
        .to_sigstore_signer(&SigningScheme::ECDSA_P256_SHA256_ASN1)
        .map_err(|e| err(&e))?;
    match format {
        Format::Legacy => sign_legacy(pinned, signer, auth, plain_http).await,
        Format::Bundle => {
            let public_der = pair.public_key_to_der().map_err(|e| err(&e))?;
            sign_bundle(pinned, &signer, &public_der, auth, plain_http).await
        }
    }
    .map_err(|e| err(&e))
}

/// The in-toto statement cosign signs for an image digest (`sha256:<hex>`), of
/// predicate type `CosignSignPredicateType` (`pkg/types/predicate.go@v3.1.1`).
pub fn statement(digest: &str) -> Vec<u8> {
    let hex_digest = digest.strip_prefix("sha256:").unwrap_or(digest);
    // Field order as cosign 3.1.1 writes it.
    format!(
        r#"{{"_type":"https://in-toto.io/Statement/v1","subject":[{{"digest":{{"sha256":"{hex_digest}"}},"annotations":{{}}}}],"predicateType":"{COSIGN_SIGN_PREDICATE}","predicate":{{}}}}"#
    )
    .into_bytes()
}

/// A key-signed Sigstore bundle (v0.3) of `digest`: the DSSE envelope of [`statement`],
/// signed over its PAE, with the public key's hint (base64 of the SHA-256 of its DER) as
/// verification material.
pub fn key_bundle(
    digest: &str,
    signer: &SigStoreSigner,
    public_der: &[u8],
) -> Result<Vec<u8>, String> {
    let payload = statement(digest);
    let signature = signer
        .sign(&pae(IN_TOTO_PAYLOAD_TYPE, &payload))
        .map_err(|e| e.to_string())?;
    let bundle = json!({
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {
            "publicKey": {"hint": STANDARD.encode(Sha256::digest(public_der))},
        },
        "dsseEnvelope": {
            "payload": STANDARD.encode(&payload),
            "payloadType": IN_TOTO_PAYLOAD_TYPE,
            "signatures": [{"sig": STANDARD.encode(&signature)}],
        },
    });
    serde_json::to_vec(&bundle).map_err(|e| e.to_string())
}

/// The OCI artifact manifest holding `bundle` (its one layer), for the image manifest
/// `subject` (a descriptor), with cosign's annotations.
pub fn bundle_manifest(bundle: &[u8], subject: &Value, created: &str) -> Value {
    json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": BUNDLE_MEDIA_TYPE,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, "size": 2, "digest": sha256(b"{}")},
        "layers": [{"mediaType": BUNDLE_MEDIA_TYPE, "size": bundle.len(), "digest": sha256(bundle)}],
        "subject": subject,
        "annotations": {
            "dev.sigstore.bundle.content": "dsse-envelope",
            "dev.sigstore.bundle.predicateType": COSIGN_SIGN_PREDICATE,
            "org.opencontainers.image.created": created,
        },
    })
}

/// The fallback referrers index after adding `descriptor`: the `previous` index's
/// manifests (another signature stays) without an older entry of the same digest.
pub fn with_referrer(previous: Option<&Value>, descriptor: Value) -> Value {
    let mut manifests: Vec<Value> = previous
        .and_then(|p| p["manifests"].as_array())
        .into_iter()
        .flatten()
        .filter(|m| m["digest"] != descriptor["digest"])
        .cloned()
        .collect();
    manifests.push(descriptor);
    json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

/// Push the key-signed bundle of `pinned` as its OCI referrer ([`Format::Bundle`]).
async fn sign_bundle(
    pinned: &str,
    signer: &SigStoreSigner,
    public_der: &[u8],
    auth: &RegistryAuth,
    plain_http: Vec<String>,
) -> Result<(), String> {
    let image: Reference = pinned.parse().map_err(|e| format!("{e}"))?;
    let digest = image
        .digest()
        .ok_or_else(|| format!("{pinned} is not pinned to a digest"))?
        .to_string();
    let by_digest = |d: &str| {
        Reference::with_digest(
            image.registry().to_string(),
            image.repository().to_string(),
            d.to_string(),
        )
    };
    let reader = registry::Client::new(auth.clone(), plain_http.clone(), Timeouts::default());
    let subject = reader.manifest(&image).await.map_err(|e| e.message)?;
    let subject = json!({
        "mediaType": subject.media_type.as_deref().unwrap_or(OCI_MANIFEST),
        "size": subject.bytes.len(),
        "digest": digest,
    });
    let bundle = key_bundle(&digest, signer, public_der)?;
    let created = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map_err(|e| e.to_string())?
        .to_string();
    let manifest = serde_json::to_vec(&bundle_manifest(&bundle, &subject, &created))
        .map_err(|e| e.to_string())?;
    let manifest_digest = sha256(&manifest);
    let writer = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(plain_http),
        ..ClientConfig::default()
    });
    writer
        .store_auth_if_needed(image.resolve_registry(), auth)
        .await;
    for blob in [bundle.clone(), b"{}".to_vec()] {
        let d = sha256(&blob);
        writer
            .push_blob(&by_digest(&digest), blob, &d)
            .await
            .map_err(|e| format!("pushing the bundle: {e}"))?;
    }
    writer
        .push_manifest_raw(
            &by_digest(&manifest_digest),
            manifest.clone(),
            reqwest_oci::header::HeaderValue::from_static(OCI_MANIFEST),
        )
        .await
        .map_err(|e| format!("pushing the bundle's manifest: {e}"))?;
    let descriptor = json!({
        "mediaType": OCI_MANIFEST,
        "size": manifest.len(),
        "digest": manifest_digest,
        "artifactType": BUNDLE_MEDIA_TYPE,
        "annotations": {
            "dev.sigstore.bundle.content": "dsse-envelope",
            "dev.sigstore.bundle.predicateType": COSIGN_SIGN_PREDICATE,
            "org.opencontainers.image.created": created,
        },
    });
    list_referrer(&reader, &writer, &image, &digest, descriptor).await
}

/// Make the artifact `descriptor` findable as a referrer of `digest`: a registry with
/// the referrers API lists it by its subject already; else it is added to the image index
/// under the fallback tag `sha256-<hex>` (other signatures there stay).
async fn list_referrer(
    reader: &registry::Client,
    writer: &oci_client::Client,
    image: &Reference,
    digest: &str,
    descriptor: Value,
) -> Result<(), String> {
    let listed = reader
        .referrers(image, digest)
        .await
        .map_err(|e| e.message)?
        .and_then(|index| serde_json::from_slice::<Value>(&index.bytes).ok())
        .is_some_and(|index| {
            index["manifests"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["digest"] == descriptor["digest"]))
        });
    if listed {
        return Ok(());
    }
    let tag = Reference::with_tag(
        image.registry().to_string(),
        image.repository().to_string(),
        digest.replace(':', "-"),
    );
    let previous = match reader.manifest(&tag).await {
        Ok(m) => serde_json::from_slice::<Value>(&m.bytes).ok(),
        Err(e) if e.not_found => None,
        Err(e) => return Err(e.message),
    };
    let index = serde_json::to_vec(&with_referrer(previous.as_ref(), descriptor))
        .map_err(|e| e.to_string())?;
    writer
        .push_manifest_raw(
            &tag,
            index,
            reqwest_oci::header::HeaderValue::from_static(OCI_INDEX),
        )
        .await
        .map_err(|e| format!("pushing the referrers index {tag}: {e}"))?;
    Ok(())
}

/// Push the simple-signing signature of `pinned` ([`Format::Legacy`]).
async fn sign_legacy(
    pinned: &str,
    signer: SigStoreSigner,
    auth: &RegistryAuth,
    plain_http: Vec<String>,
) -> Result<(), String> {
    use sigstore::cosign::constraint::PrivateKeySigner;
    use sigstore::cosign::{
        ClientBuilder, Constraint as _, CosignCapabilities as _, SignatureLayer,
    };
    use sigstore::registry::{Auth, OciReference};
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let mut client = ClientBuilder::default()
        .with_oci_client_config(sigstore::registry::ClientConfig {
            protocol: sigstore::registry::ClientProtocol::HttpsExcept(plain_http),
            ..Default::default()
        })
        .build()
        .map_err(|x| e(&x))?;
    let image: OciReference = pinned.parse().map_err(|x| e(&x))?;
    let auth = Auth::from(auth);
    let (cosign_image, digest) = client.triangulate(&image, &auth).await.map_err(|x| e(&x))?;
    let mut layer = SignatureLayer::new_unsigned(&image, &digest).map_err(|x| e(&x))?;
    PrivateKeySigner::new_with_signer(signer)
        .add_constraint(&mut layer)
        .map_err(|x| e(&x))?;
    client
        .push_signature(None, &auth, &cosign_image, vec![layer])
        .await
        .map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sigstore::crypto::SigningScheme;

    const DIGEST: &str = "sha256:5a53f9a6919e6204033abfef16df1ab16e6864826e316022464f2ca76b546209";

    #[test]
    fn key_bundles_parse_and_verify_as_the_controller_reads_them() {
        let signer = SigningScheme::ECDSA_P256_SHA256_ASN1
            .create_signer()
            .unwrap();
        let pair = signer.to_sigstore_keypair().unwrap();
        let der = pair.public_key_to_der().unwrap();
        let pem = pair.public_key_to_pem().unwrap();
        let bundle = key_bundle(DIGEST, &signer, &der).unwrap();
        let signed = crate::bundle::parse(&bundle, DIGEST).unwrap();
        assert!(signed.certificates.is_empty() && signed.entries.is_empty());
        let key = sigstore::crypto::CosignVerificationKey::try_from_pem(pem.as_bytes()).unwrap();
        assert!(signed.verifies_with(&key));
        // Another key does not verify it; another digest is not its subject.
        let other = SigningScheme::ECDSA_P256_SHA256_ASN1
            .create_signer()
            .unwrap()
            .to_sigstore_keypair()
            .unwrap()
            .public_key_to_pem()
            .unwrap();
        let other =
            sigstore::crypto::CosignVerificationKey::try_from_pem(other.as_bytes()).unwrap();
        assert!(!signed.verifies_with(&other));
        let elsewhere = format!("sha256:{}", "0".repeat(64));
        assert!(crate::bundle::parse(&bundle, &elsewhere).is_err());
    }

    #[test]
    fn statements_are_cosigns() {
        // The payload of a bundle written by cosign 3.1.1 (bundle.rs' COSIGN_BUNDLE).
        assert_eq!(
            String::from_utf8(statement(DIGEST)).unwrap(),
            r#"{"_type":"https://in-toto.io/Statement/v1","subject":[{"digest":{"sha256":"5a53f9a6919e6204033abfef16df1ab16e6864826e316022464f2ca76b546209"},"annotations":{}}],"predicateType":"https://sigstore.dev/cosign/sign/v1","predicate":{}}"#
        );
    }

    #[test]
    fn the_fallback_index_keeps_other_referrers_once() {
        let a = json!({"digest": "sha256:a", "artifactType": BUNDLE_MEDIA_TYPE});
        let b = json!({"digest": "sha256:b", "artifactType": BUNDLE_MEDIA_TYPE});
        let first = with_referrer(None, a.clone());
        assert_eq!(first["manifests"], json!([a]));
        assert_eq!(first["mediaType"], OCI_INDEX);
        let both = with_referrer(Some(&first), b.clone());
        assert_eq!(both["manifests"], json!([a, b]));
        let again = with_referrer(Some(&both), a.clone());
        assert_eq!(again["manifests"], json!([b, a]));
    }

    #[test]
    fn bundle_manifests_name_their_subject_and_layer() {
        let subject = json!({"mediaType": OCI_MANIFEST, "size": 10, "digest": DIGEST});
        let m = bundle_manifest(b"bundle", &subject, "2026-01-01T00:00:00Z");
        assert_eq!(m["subject"], subject);
        assert_eq!(m["artifactType"], BUNDLE_MEDIA_TYPE);
        assert_eq!(m["layers"][0]["digest"], sha256(b"bundle"));
        assert_eq!(m["layers"][0]["size"], 6);
        assert_eq!(
            m["config"]["digest"],
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert!(crate::bundle::is_bundle_type(
            m["layers"][0]["mediaType"].as_str().unwrap()
        ));
    }
}
