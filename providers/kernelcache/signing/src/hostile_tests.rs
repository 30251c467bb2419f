//! The signature object of a hostile registry: one with 100,000 layers is refused from
//! its size, unread, and one with more layers than are checked is refused before any is
//! fetched.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kubeairunway_kernelcache_artifact::registry::MAX_MANIFEST_BYTES;
use kubeairunway_kernelcache_artifact::registry::{Client, Timeouts};
use kubeairunway_kernelcache_artifact::testing::{Hostile, digest, not_found, ok};
use oci_client::secrets::RegistryAuth;
use serde_json::json;

/// Socket buffers let a server write somewhat more than the client reads.
const SLACK: u64 = 16 << 20;

#[tokio::test]
async fn a_signature_object_with_100000_layers_is_refused_unread() {
    let layers: Vec<_> = (0..100_000)
        .map(|i| {
            json!({
                "mediaType": crate::fetch::SIMPLE_SIGNING_MEDIA_TYPE,
                "digest": digest(format!("{i}").as_bytes()),
                "size": 200,
            })
        })
        .collect();
    let huge = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(b"{}"), "size": 2},
        "layers": layers,
    }))
    .unwrap();
    let few = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(b"{}"), "size": 2},
        "layers": layers[..65],
    }))
    .unwrap();
    let blobs = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&blobs);
    let server = Hostile::start(move |_, path| {
        if path.contains("/blobs/") {
            counted.fetch_add(1, Ordering::SeqCst);
            not_found()
        } else if path.contains("/manifests/sha256-1") {
            ok(huge.clone())
        } else if path.contains("/manifests/sha256-2") {
            ok(few.clone())
        } else {
            not_found()
        }
    })
    .await;
    let policy = kubeairunway_kernelcache_api::KernelCachePolicySpec {
        mode: kubeairunway_kernelcache_api::VerificationMode::Key,
        public_keys: vec![
            "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAETJP9cqpUQsn2ggmJniWGjHdlsHzD\nJsB89BPhZYch0U0hKANx5TY+ncrm0s8bfJxxHoenAEFhwhuXeb4PqIrtoQ==\n-----END PUBLIC KEY-----".into(),
        ],
        ..Default::default()
    };
    let client = Client::new(
        RegistryAuth::Anonymous,
        vec![server.host()],
        Timeouts {
            request: Duration::from_secs(1),
            ..Timeouts::default()
        },
    );
    let one = format!("{}/caches/x@sha256:{}", server.host(), "1".repeat(64));
    let err = crate::verify::verify_with(&policy, &one, &client)
        .await
        .unwrap_err();
    // Refused from its Content-Length (or, without one, at the 4 MiB cap while reading).
    assert!(err.to_string().contains("more than the 4194304"), "{err}");
    let two = format!("{}/caches/x@sha256:{}", server.host(), "2".repeat(64));
    let err = crate::verify::verify_with(&policy, &two, &client)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "registry: 65 signature layers, more than the 64 checked"
    );
    assert_eq!(
        blobs.load(Ordering::SeqCst),
        0,
        "no signature layer fetched"
    );
    assert!(server.sent() < MAX_MANIFEST_BYTES + SLACK);
}
