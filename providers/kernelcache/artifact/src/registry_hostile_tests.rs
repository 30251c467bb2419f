//! A hostile registry on loopback: endless bodies, wrong `Content-Length`s, a body that
//! trickles, a signature object with 100,000 layers, a token realm that points back at
//! loopback and never stops answering. Each case must end with a clear error, within the
//! byte limits and deadlines of [`super`]: asserted by the error and by how many bytes
//! the server managed to send (never by wall-clock time).

use std::time::Duration;

use oci_client::secrets::RegistryAuth;
use serde_json::json;

use super::Timeouts;
use crate::extract::Limits;
use crate::oci::{PullError, Puller};
use crate::testing::{Hostile, Reply, digest, ok, tar_gz};

/// A valid-looking Triton cache image: (manifest, config) bytes; the layer is declared
/// with `layer_digest` and `layer_size`.
fn image(layer_digest: &str, layer_size: u64) -> (Vec<u8>, Vec<u8>) {
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Labels": {
            "cache.triton.image/summary": r#"{"targets":[{"backend":"cuda","arch":"90","warp_size":32}]}"#,
        }},
        "rootfs": {"type": "layers", "diff_ids": []},
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest, "size": layer_size}],
    }))
    .unwrap();
    (manifest, config)
}

fn quick() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(5),
        idle: Duration::from_secs(30),
        request: Duration::from_secs(1),
        min_rate: 1 << 20,
    }
}

/// A server for one image whose layer is answered by `layer`; the pinned reference.
async fn serve_image(layer: Reply, layer_size: u64) -> (Hostile, String) {
    serve_layer(layer, &digest(b"the real layer"), layer_size).await
}

/// [`serve_image`] with the layer declared as `layer_digest`.
async fn serve_layer(layer: Reply, layer_digest: &str, layer_size: u64) -> (Hostile, String) {
    let (manifest, config) = image(layer_digest, layer_size);
    let manifest_digest = digest(&manifest);
    let config_digest = digest(&config);
    let server = Hostile::start(move |_, path| {
        if path.contains("/manifests/") {
            ok(manifest.clone())
        } else if path.ends_with(&config_digest) {
            ok(config.clone())
        } else if path.contains("/blobs/") {
            layer.clone()
        } else {
            ok(Vec::new())
        }
    })
    .await;
    let pinned = format!("{}/caches/x@{manifest_digest}", server.host());
    (server, pinned)
}

async fn stage(server: &Hostile, pinned: &str) -> (tempfile::TempDir, PullError) {
    let root = tempfile::tempdir().unwrap();
    let puller = Puller::with_timeouts(RegistryAuth::Anonymous, vec![server.host()], quick());
    let err = puller
        .stage(pinned, root.path(), "ml", "x", None, Limits::default())
        .await
        .unwrap_err();
    // Nothing staged, nothing half extracted.
    let left: Vec<_> = std::fs::read_dir(root.path())
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
    (root, err)
}

/// Socket buffers let a server write somewhat more than the client reads.
const SLACK: u64 = 16 << 20;

#[tokio::test]
async fn an_endless_layer_stops_at_its_declared_size() {
    let (server, pinned) = serve_image(Reply::Endless, 1000).await;
    let (_root, err) = stage(&server, &pinned).await;
    assert!(
        err.to_string()
            .contains("the registry sent more than the 1000 bytes its descriptor declares"),
        "{err}"
    );
    assert!(!err.is_transient());
    assert!(server.sent() < SLACK, "server sent {}", server.sent());
}

#[tokio::test]
async fn an_endless_manifest_stops_at_the_manifest_cap() {
    let server = Hostile::start(|_, _| Reply::Endless).await;
    let puller = Puller::with_timeouts(RegistryAuth::Anonymous, vec![server.host()], quick());
    let pinned = format!("{}/caches/x@{}", server.host(), digest(b"m"));
    let err = puller.inspect(&pinned).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("the registry sent more than the 4194304 bytes accepted"),
        "{err}"
    );
    assert!(server.sent() < super::MAX_MANIFEST_BYTES + SLACK);
}

#[tokio::test]
async fn wrong_content_lengths_are_refused() {
    // More declared than the descriptor says: refused before reading the body.
    let (server, pinned) = serve_image(
        Reply::Short {
            length: 5000,
            sent: vec![0; 5000],
        },
        1000,
    )
    .await;
    let (_root, err) = stage(&server, &pinned).await;
    assert!(
        err.to_string()
            .contains("declares 5000 bytes (Content-Length), its descriptor 1000"),
        "{err}"
    );
    // The declared length agrees, the body ends early: a transient failure, said so.
    let (server, pinned) = serve_image(
        Reply::Short {
            length: 1000,
            sent: vec![0; 10],
        },
        1000,
    )
    .await;
    let (_root, err) = stage(&server, &pinned).await;
    assert!(err.to_string().contains("reading layer sha256:"), "{err}");
    assert!(err.is_transient(), "{err}");
    // A manifest declaring more than the cap is not read at all.
    let server = Hostile::start(|_, _| Reply::Short {
        length: 1 << 40,
        sent: Vec::new(),
    })
    .await;
    let puller = Puller::with_timeouts(RegistryAuth::Anonymous, vec![server.host()], quick());
    let err = puller
        .inspect(&format!("{}/caches/x@{}", server.host(), digest(b"m")))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("declares 1099511627776 bytes, more than the 4194304 accepted"),
        "{err}"
    );
}

#[tokio::test]
async fn a_trickling_layer_times_out_by_its_deadline() {
    let (server, pinned) = serve_image(
        Reply::Trickle {
            length: 1000,
            every: Duration::from_millis(50),
        },
        1000,
    )
    .await;
    let (_root, err) = stage(&server, &pinned).await;
    // quick(): 1 s per request plus 1000 bytes at 1 MiB/s: a 1 s deadline.
    assert!(err.to_string().contains("timed out after 1s"), "{err}");
    assert!(err.is_transient());
    assert!(server.sent() < 1000, "the transfer was cut short");
}

#[tokio::test]
async fn a_token_realm_on_loopback_that_never_stops_is_cut_at_the_token_cap() {
    let server = Hostile::start(|_, path| {
        if path.starts_with("/token") {
            Reply::Endless
        } else {
            Reply::Full {
                status: 401,
                headers: Vec::new(),
                body: Vec::new(),
            }
        }
    })
    .await;
    let host = server.host();
    let realm_server = Hostile::start(move |_, path| {
        if path.starts_with("/token") {
            Reply::Endless
        } else {
            Reply::Full {
                status: 401,
                headers: vec![(
                    "WWW-Authenticate".into(),
                    format!(r#"Bearer realm="http://{host}/token",service="hostile""#),
                )],
                body: Vec::new(),
            }
        }
    })
    .await;
    let puller = Puller::with_timeouts(
        RegistryAuth::Basic("user".into(), "secret".into()),
        vec![realm_server.host()],
        quick(),
    );
    let err = puller
        .resolve(&format!("{}/caches/x:v1", realm_server.host()))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "a token from http://{}/token: the registry sent more than the 65536 bytes accepted",
            server.host()
        )),
        "{err}"
    );
    assert!(server.sent() < super::MAX_TOKEN_BYTES + SLACK);

    // A realm in clear text for a registry spoken to over HTTPS is never asked: the
    // credentials would travel unencrypted to wherever the registry points.
    let client = super::Client::new(
        RegistryAuth::Basic("user".into(), "secret".into()),
        Vec::new(),
        quick(),
    );
    let reference: oci_client::Reference = "registry.invalid/caches/x:v1".parse().unwrap();
    let e = client
        .authorize(
            &reference,
            &format!(r#"Bearer realm="http://{}/token""#, server.host()),
            tokio::time::Instant::now() + Duration::from_secs(1),
            "manifest",
        )
        .await
        .unwrap_err();
    assert!(e.message.contains("refusing token realm"), "{e}");
}

#[tokio::test]
async fn a_layer_that_stalls_times_out_idle() {
    let (server, pinned) = serve_image(
        Reply::Stall {
            length: 1000,
            sent: vec![0x1f; 10],
        },
        1000,
    )
    .await;
    let root = tempfile::tempdir().unwrap();
    // A deadline far away: only the idle timeout can end it.
    let timeouts = Timeouts {
        idle: Duration::from_secs(1),
        request: Duration::from_secs(3600),
        ..quick()
    };
    let puller = Puller::with_timeouts(RegistryAuth::Anonymous, vec![server.host()], timeouts);
    let err = puller
        .stage(&pinned, root.path(), "ml", "x", None, Limits::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("reading layer sha256:"), "{err}");
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(err.is_transient());
    let left: Vec<_> = std::fs::read_dir(root.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

fn triton_layer(extra: &[(&str, &[u8])]) -> Vec<u8> {
    let manifest =
        br#"{"triton": [{"hash": "all", "backend": "cuda", "arch": "90", "warp_size": 32}]}"#;
    let group = br#"{"child_paths": {"k.json": "/workspace/.triton/cache/H/k.json"}}"#;
    let mut files: Vec<(&str, &[u8])> = vec![
        ("io.triton.cache/H/k.json", b"{}"),
        ("io.triton.cache/H/__grp__k.json", group),
        ("io.triton.manifest/manifest.json", manifest),
    ];
    files.extend_from_slice(extra);
    tar_gz(&files)
}

#[tokio::test]
async fn a_layer_streams_into_its_cache_with_group_files_pointed_at_the_mount() {
    let gz = triton_layer(&[]);
    let (server, pinned) = serve_layer(ok(gz.clone()), &digest(&gz), gz.len() as u64).await;
    let root = tempfile::tempdir().unwrap();
    let puller = Puller::with_timeouts(RegistryAuth::Anonymous, vec![server.host()], quick());
    let staged = puller
        .stage(
            &pinned,
            root.path(),
            "ml",
            "x",
            Some("/m"),
            Limits::default(),
        )
        .await
        .unwrap();
    assert_eq!(staged.extracted.files, 3);
    let group =
        std::fs::read_to_string(staged.dir.join("io.triton.cache/H/__grp__k.json")).unwrap();
    assert_eq!(group, r#"{"child_paths":{"k.json":"/m/H/k.json"}}"#);
    let entries: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        entries,
        ["ml"],
        "no staging or download left beside the cache"
    );
}

#[tokio::test]
async fn a_layer_not_matching_its_digest_never_appears_and_is_reported_as_such() {
    // A valid cache layer, but not the one the descriptor names: extraction can finish,
    // the cache must not appear.
    let gz = triton_layer(&[]);
    let (server, pinned) = serve_image(ok(gz.clone()), gz.len() as u64).await;
    let (_root, err) = stage(&server, &pinned).await;
    assert!(err.to_string().contains("(digest mismatch)"), "{err}");
    assert!(!err.is_transient());

    // A layer whose extraction fails at its first entry, followed by a MiB more: the
    // rest is still read and checked, and the digest is the cause reported.
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let mut header = tar::Header::new_gnu();
    header.as_old_mut().name[..9].copy_from_slice(b"../escape");
    header.set_size(1);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append(&header, &b"x"[..]).unwrap();
    let evil = builder.into_inner().unwrap().finish().unwrap();
    let mut padded = evil.clone();
    padded.extend(std::iter::repeat_n(0u8, 1 << 20));
    let (server, pinned) = serve_image(ok(padded.clone()), padded.len() as u64).await;
    let (_root, err) = stage(&server, &pinned).await;
    assert!(err.to_string().contains("(digest mismatch)"), "{err}");
    assert!(server.sent() > 1 << 20, "read to its end");

    // The same layer under its own digest: the extraction's refusal.
    let (server, pinned) = serve_layer(ok(evil.clone()), &digest(&evil), evil.len() as u64).await;
    let (_root, err) = stage(&server, &pinned).await;
    assert!(err.to_string().contains("contains '..'"), "{err}");
}

#[tokio::test]
async fn a_slow_reader_is_not_held_against_the_registry() {
    // 2 MiB at quick()'s 1 MiB/s: a 3 s deadline; the reader takes longer than that, the
    // registry does not.
    let blob: Vec<u8> = (0..2u32 << 20).map(|i| (i % 251) as u8).collect();
    let blob_digest = digest(&blob);
    let served = blob.clone();
    let server = Hostile::start(move |_, _| ok(served.clone())).await;
    let client = super::Client::new(RegistryAuth::Anonymous, vec![server.host()], quick());
    let reference: oci_client::Reference =
        format!("{}/caches/x:v1", server.host()).parse().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let reading = tokio::task::spawn_blocking(move || {
        let mut reader = super::BlobReader::new(rx);
        let mut first = [0u8; 1];
        std::io::Read::read_exact(&mut reader, &mut first).unwrap();
        std::thread::sleep(Duration::from_secs(4));
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut reader, &mut rest).unwrap();
        [&first[..], &rest].concat()
    });
    let received = client
        .blob_stream(&reference, &blob_digest, blob.len() as u64, tx)
        .await
        .unwrap();
    assert_eq!(received, blob.len() as u64);
    assert_eq!(reading.await.unwrap(), blob);
}
