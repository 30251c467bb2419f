//! Sigstore bundles (v0.1 to v0.3), the signature format cosign 3 writes by default: an
//! OCI artifact whose `subject` is the image, found through the referrers API or its
//! fallback tag `sha256-<hex>` (an image index), holding one layer
//! `application/vnd.dev.sigstore.bundle.v0.3+json` (or `...bundle+json;version=0.1|0.2`).
//!
//! The bundle's content is a DSSE envelope of an in-toto statement (predicate type
//! `https://sigstore.dev/cosign/sign/v1`) whose subject is the image digest; the
//! signature covers the envelope's PAE. Its verification material is a public-key hint
//! (`cosign sign --key`), a certificate, or a certificate chain, with transparency-log
//! entries when uploaded. What makes it trusted depends on the policy mode, as for the
//! legacy format ([`crate::verify`]):
//!
//! - `key`: the signature verifies with one of the policy's keys (log entries are not
//!   needed: the key is the trust, as `cosign verify --key --insecure-ignore-tlog`);
//! - `certificate`: the certificate chains to the CA bundle now, a SAN matches the
//!   pattern, and the signature verifies with its key;
//! - `keyless`: a log entry's signed entry timestamp verifies with a trust-root Rekor key,
//!   the entry records this envelope and signature, the certificate chains to the Fulcio
//!   certificates at the entry's integration time, and the issuer and subject are the
//!   policy's.
//!
//! Bundles are parsed with the sigstore crate's protobuf-spec types; signatures verified
//! with its keys; the SET with its `SignedArtifactBundle` verification. Every refusal
//! says why.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use sigstore::bundle::Bundle;
use sigstore::crypto::{CosignVerificationKey, Signature};
use sigstore_protobuf_specs::dev::sigstore::bundle::v1::bundle::Content;
use sigstore_protobuf_specs::dev::sigstore::bundle::v1::verification_material::Content as Material;

use crate::error::VerifyError;
use kubeairunway_kernelcache_artifact::registry::hex;

/// The in-toto payload type of cosign's DSSE envelopes.
pub const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The predicate type of `cosign sign`'s statements.
pub const COSIGN_SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";

/// What a bundle signs and with what, once parsed and checked against the image.
#[derive(Clone, Debug)]
pub struct Signed {
    /// The bytes the signature covers (the DSSE PAE).
    pub message: Vec<u8>,
    /// The DSSE payload (the in-toto statement).
    pub payload: Vec<u8>,
    /// The signature bytes.
    pub signature: Vec<u8>,
    /// The signing certificate and any chain after it (DER), when not key-signed.
    pub certificates: Vec<Vec<u8>>,
    /// Transparency-log entries.
    pub entries: Vec<sigstore_protobuf_specs::dev::sigstore::rekor::v1::TransparencyLogEntry>,
}

/// Whether an OCI media or artifact type is a Sigstore bundle.
pub fn is_bundle_type(media_type: &str) -> bool {
    media_type.starts_with("application/vnd.dev.sigstore.bundle")
}

fn bad(why: impl Into<String>) -> VerifyError {
    VerifyError::Unsatisfied(format!("Sigstore bundle: {}", why.into()))
}

/// The DSSE pre-authentication encoding (what DSSE signatures cover).
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// Parse a bundle and check that it is a cosign image signature of `digest`.
pub fn parse(bytes: &[u8], digest: &str) -> Result<Signed, VerifyError> {
    let bundle: Bundle =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("does not parse: {e}")))?;
    let material = bundle
        .verification_material
        .ok_or_else(|| bad("no verificationMaterial"))?;
    let envelope = match bundle.content {
        Some(Content::DsseEnvelope(env)) => env,
        Some(Content::MessageSignature(_)) => {
            return Err(bad(
                "a message signature names no image (cosign signs images with DSSE envelopes)",
            ));
        }
        None => return Err(bad("no content")),
    };
    if envelope.payload_type != IN_TOTO_PAYLOAD_TYPE {
        return Err(bad(format!(
            "payload type {} is not {IN_TOTO_PAYLOAD_TYPE}",
            envelope.payload_type
        )));
    }
    let statement: Value = serde_json::from_slice(&envelope.payload)
        .map_err(|e| bad(format!("the statement is not JSON: {e}")))?;
    if statement["predicateType"] != COSIGN_SIGN_PREDICATE {
        return Err(bad(format!(
            "predicate type {} is not {COSIGN_SIGN_PREDICATE}",
            statement["predicateType"]
        )));
    }
    let hex_digest = digest.strip_prefix("sha256:").unwrap_or(digest);
    let subjects: Vec<&str> = statement["subject"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["digest"]["sha256"].as_str())
        .collect();
    if !subjects.contains(&hex_digest) {
        return Err(VerifyError::DigestMismatch {
            signed: subjects
                .first()
                .map_or_else(|| "nothing".to_string(), |s| format!("sha256:{s}")),
            pinned: digest.to_string(),
        });
    }
    let [signature] = envelope.signatures.as_slice() else {
        return Err(bad(format!(
            "{} DSSE signatures, exactly one expected",
            envelope.signatures.len()
        )));
    };
    let certificates = match material.content {
        Some(Material::PublicKey(_)) | None => Vec::new(),
        Some(Material::Certificate(c)) => vec![c.raw_bytes],
        Some(Material::X509CertificateChain(chain)) => chain
            .certificates
            .into_iter()
            .map(|c| c.raw_bytes)
            .collect(),
    };
    Ok(Signed {
        message: pae(&envelope.payload_type, &envelope.payload),
        payload: envelope.payload.clone(),
        signature: signature.sig.clone(),
        certificates,
        entries: material.tlog_entries,
    })
}

impl Signed {
    /// Whether `key` made the signature.
    pub fn verifies_with(&self, key: &CosignVerificationKey) -> bool {
        key.verify_signature(Signature::Raw(&self.signature), &self.message)
            .is_ok()
    }

    /// The signing certificate, PEM.
    pub fn certificate_pem(&self) -> Option<String> {
        self.certificates.first().map(|der| {
            let body = STANDARD.encode(der);
            let lines: Vec<&str> = body
                .as_bytes()
                .chunks(64)
                .filter_map(|c| std::str::from_utf8(c).ok())
                .collect();
            format!(
                "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                lines.join("\n")
            )
        })
    }

    /// The integration time of the first log entry whose SET verifies with one of
    /// `rekor` and that records this envelope and signature.
    pub fn logged(
        &self,
        rekor: &std::collections::BTreeMap<String, CosignVerificationKey>,
    ) -> Result<u64, VerifyError> {
        let untrusted = |why: String| VerifyError::Untrusted(format!("Sigstore bundle: {why}"));
        if self.entries.is_empty() {
            return Err(untrusted(
                "no transparency-log entry (signed with --tlog-upload=false?)".into(),
            ));
        }
        let cert = self
            .certificate_pem()
            .ok_or_else(|| untrusted("no certificate".into()))?;
        let mut last = String::new();
        for entry in &self.entries {
            let Some(promise) = &entry.inclusion_promise else {
                last = "a log entry without an inclusion promise (SET)".into();
                continue;
            };
            let log_id = entry
                .log_id
                .as_ref()
                .map(|l| hex(&l.key_id))
                .unwrap_or_default();
            // sigstore verifies a SET given in the shape of cosign's blob bundles.
            let artifact = serde_json::json!({
                "base64Signature": STANDARD.encode(&self.signature),
                "cert": cert,
                "rekorBundle": {
                    "SignedEntryTimestamp": STANDARD.encode(&promise.signed_entry_timestamp),
                    "Payload": {
                        "body": STANDARD.encode(&entry.canonicalized_body),
                        "integratedTime": entry.integrated_time,
                        "logIndex": entry.log_index,
                        "logID": log_id,
                    },
                },
            });
            if let Err(e) = sigstore::cosign::bundle::SignedArtifactBundle::new_verified(
                &artifact.to_string(),
                rekor,
            ) {
                last =
                    format!("the log entry's SET does not verify with a trustRoot Rekor key: {e}");
                continue;
            }
            if let Err(why) = self.recorded_by(&entry.canonicalized_body) {
                last = why;
                continue;
            }
            return u64::try_from(entry.integrated_time)
                .map_err(|_| untrusted("a negative integration time".into()));
        }
        Err(untrusted(last))
    }

    /// Whether a log entry body (`dsse` or `intoto` kind) records this envelope's payload
    /// and signature.
    fn recorded_by(&self, body: &[u8]) -> Result<(), String> {
        let body: Value = serde_json::from_slice(body)
            .map_err(|_| "the log entry body is not JSON".to_string())?;
        let payload_hash = hex(&Sha256::digest(&self.payload));
        let signature = STANDARD.encode(&self.signature);
        match body["kind"].as_str() {
            Some("dsse") => {
                if body["spec"]["payloadHash"]["value"] != payload_hash.as_str() {
                    return Err("the log entry records another payload".into());
                }
                let signed = body["spec"]["signatures"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|s| s["signature"] == signature.as_str());
                if signed {
                    Ok(())
                } else {
                    Err("the log entry records another signature".into())
                }
            }
            Some(other) => Err(format!("a log entry of kind {other}, not dsse")),
            None => Err("a log entry without kind".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_dsse_v1() {
        assert_eq!(
            pae("application/vnd.in-toto+json", b"{}"),
            b"DSSEv1 28 application/vnd.in-toto+json 2 {}".to_vec()
        );
    }

    /// A bundle as cosign 3.1.1 writes it (`cosign sign --key`, offline): key hint, DSSE.
    const COSIGN_BUNDLE: &str = r#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","verificationMaterial":{"publicKey":{"hint":"ji2/OpGuKiOh4R4oJaO15KXRm/96WdeycACYf7COXEY="}},"dsseEnvelope":{"payload":"eyJfdHlwZSI6Imh0dHBzOi8vaW4tdG90by5pby9TdGF0ZW1lbnQvdjEiLCJzdWJqZWN0IjpbeyJkaWdlc3QiOnsic2hhMjU2IjoiNWE1M2Y5YTY5MTllNjIwNDAzM2FiZmVmMTZkZjFhYjE2ZTY4NjQ4MjZlMzE2MDIyNDY0ZjJjYTc2YjU0NjIwOSJ9LCJhbm5vdGF0aW9ucyI6e319XSwicHJlZGljYXRlVHlwZSI6Imh0dHBzOi8vc2lnc3RvcmUuZGV2L2Nvc2lnbi9zaWduL3YxIiwicHJlZGljYXRlIjp7fX0=","payloadType":"application/vnd.in-toto+json","signatures":[{"sig":"MEUCIQCkI1sec4qu6vEgNojmX3Jvtdx0N/h2a7RT7o/swVa9YwIgR7Gx/9eI0CVqX3dJFKYr8glkNvOCRQXo81+Ps2AxgS8="}]}}"#;
    const SIGNED: &str = "sha256:5a53f9a6919e6204033abfef16df1ab16e6864826e316022464f2ca76b546209";

    #[test]
    fn parses_cosigns_bundle_and_checks_the_subject() {
        let signed = parse(COSIGN_BUNDLE.as_bytes(), SIGNED).unwrap();
        assert!(signed.certificates.is_empty(), "key-signed");
        assert!(signed.entries.is_empty());
        assert!(
            signed
                .message
                .starts_with(b"DSSEv1 28 application/vnd.in-toto+json ")
        );
        let other = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
        assert!(matches!(
            parse(COSIGN_BUNDLE.as_bytes(), other),
            Err(VerifyError::DigestMismatch { .. })
        ));
        let e = parse(b"{}", SIGNED).unwrap_err();
        assert!(e.to_string().starts_with("unsatisfied constraints"), "{e}");
        assert!(e.to_string().contains("Sigstore bundle"), "{e}");
    }
}
