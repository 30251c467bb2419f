//! Reading an image's signatures from its registry, within bounds: cosign's legacy
//! simple-signing object (the `sha256-<hex>.sig` tag) and Sigstore bundles (through the
//! referrers API or its fallback tag), each layer checked against its digest, every
//! payload checked to name the pinned digest.

use std::collections::BTreeMap;

use oci_client::Reference;
use oci_client::manifest::OciImageManifest;
use sigstore::crypto::Signature;

use crate::bundle;
use crate::error::VerifyError;
use crate::x509::certificate_key;
use kubeairunway_kernelcache_artifact::registry;

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

/// At most this many signature layers are read.
pub const MAX_SIGNATURES: usize = 64;

/// A signature layer larger than this is refused.
pub const MAX_SIGNATURE_BYTES: u64 = 1 << 20;

/// One simple-signing layer: its payload (digest-checked) and annotations.
#[derive(Debug, Clone)]
pub(crate) struct RawSignature {
    pub(crate) payload: Vec<u8>,
    pub(crate) annotations: BTreeMap<String, String>,
}

impl RawSignature {
    pub(crate) fn signature(&self) -> Result<&str, VerifyError> {
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
pub(crate) struct Found {
    pub(crate) legacy: Vec<RawSignature>,
    pub(crate) bundles: Vec<Result<bundle::Signed, VerifyError>>,
}

pub(crate) async fn fetch_all(
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

impl RawSignature {
    /// This legacy signature checked with the public key of the certificate `leaf` (DER).
    pub(crate) fn verify_by_certificate(&self, leaf: &[u8]) -> Result<(), VerifyError> {
        certificate_key(leaf)?
            .verify_signature(
                Signature::Base64Encoded(self.signature()?.as_bytes()),
                &self.payload,
            )
            .map_err(|e| {
                VerifyError::Unsatisfied(format!(
                    "the signature does not verify with the certificate's key: {e}"
                ))
            })
    }
}
