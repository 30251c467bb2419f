//! `oci://` model caches against a real OCI registry on loopback (Debian's
//! `docker-registry`): ModelPack artifacts and KitOps ModelKits pushed with oci-client,
//! pulled by `kubeairunway cache model pull oci://...` (the node agent's code) into the
//! Hugging Face layout and read offline by the real `huggingface_hub` client (pinned in
//! providers/modelcache/hub/tests/hfhub-venv.sh); tampered blobs, hostile tars and
//! unsupported media types refused with nothing published; and a ModelCache of an
//! `oci://` source going Ready through a real agent on the test API server.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use kubeairunway_e2e::cache_images::{oci_client, pinned, puller, start_registry};
use kubeairunway_e2e::eventually;
use kubeairunway_kernelcache_agent::models::decide::oci_reason;
use kubeairunway_kernelcache_api::model::{ModelCacheState, conditions, reasons};
use kubeairunway_kernelcache_artifact::extract::Limits;
use kubeairunway_kernelcache_artifact::modelpack::pull::{ModelError, Target};
use kubeairunway_kernelcache_artifact::modelpack::{
    FILEPATH_ANNOTATION, KITOPS_CONFIG, MODELPACK_ARTIFACT_TYPE, MODELPACK_CONFIG,
};
use kubeairunway_modelcache_hub::RepoId;
use kubeairunway_modelcache_hub::testing::StandIn;
use kubeairunway_testcluster::registry::Registry;
use oci_client::Reference;
use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::OciImageManifest;
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::modelcache::{
    cache_where, condition, model_cache, node, setup, start_agent_with, start_controller,
};

const RAW: &str = "application/vnd.cncf.model.weight.v1.raw";
const CONFIG_RAW: &str = "application/vnd.cncf.model.weight.config.v1.raw";
const DOC_TAR: &str = "application/vnd.cncf.model.doc.v1.tar";
const CODE_TAR_GZIP: &str = "application/vnd.cncf.model.code.v1.tar+gzip";
const DATASET_TAR_ZSTD: &str = "application/vnd.cncf.model.dataset.v1.tar+zstd";

fn sha(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// A deterministic "weight" of `len` bytes.
fn weight(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            u8::try_from(i % 256)
                .unwrap()
                .wrapping_mul(31)
                .wrapping_add(seed)
        })
        .collect()
}

/// A tar of `files` (regular files), gzip'd when asked.
fn tar(files: &[(&str, &[u8])], gzip: bool) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, path, *data).unwrap();
    }
    let bytes = builder.into_inner().unwrap();
    if !gzip {
        return bytes;
    }
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(&bytes).unwrap();
    gz.finish().unwrap()
}

/// A tar with one raw entry (path and link name written as given, no checks).
fn hostile_tar(path: &str, kind: tar::EntryType, link: Option<&str>) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
    if let Some(link) = link {
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    header.set_entry_type(kind);
    let data: &[u8] = if kind == tar::EntryType::Regular {
        b"escaped\n"
    } else {
        b""
    };
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append(&header, data).unwrap();
    builder.into_inner().unwrap()
}

fn layer(data: Vec<u8>, media_type: &str, path: Option<&str>) -> ImageLayer {
    ImageLayer::new(
        data,
        media_type.to_string(),
        path.map(|p| BTreeMap::from([(FILEPATH_ANNOTATION.to_string(), p.to_string())])),
    )
}

/// Pushes an artifact (`artifact_type`, config media type, layers) as `repo_tag` and
/// returns it pinned (`registry/repo@sha256:...`).
async fn push(
    registry: &Registry,
    repo_tag: &str,
    artifact_type: Option<&str>,
    config_type: &str,
    layers: &[ImageLayer],
) -> String {
    let reference: Reference = format!("{}/{repo_tag}", registry.addr()).parse().unwrap();
    let config = Config::new(
        br#"{"descriptor":{"name":"tiny"}}"#.to_vec(),
        config_type.into(),
        None,
    );
    let mut manifest = OciImageManifest::build(layers, &config, None);
    manifest.artifact_type = artifact_type.map(Into::into);
    oci_client()
        .push(
            &reference,
            layers,
            config,
            &kubeairunway_e2e::cache_images::registry_auth(registry),
            Some(manifest),
        )
        .await
        .unwrap();
    pinned(registry, &reference.to_string()).await.unwrap()
}

async fn push_modelpack(registry: &Registry, repo_tag: &str, layers: &[ImageLayer]) -> String {
    push(
        registry,
        repo_tag,
        Some(MODELPACK_ARTIFACT_TYPE),
        MODELPACK_CONFIG,
        layers,
    )
    .await
}

use kubeairunway_e2e::cli::run as kubeairunway;

/// Pulls `pinned` with the library (the agent's path) into `cache` as `model_id`.
async fn pull(
    registry: &Registry,
    pinned: &str,
    cache: &Path,
    model_id: &str,
) -> Result<(), ModelError> {
    let puller = puller(registry);
    let inspected = puller.inspect_model(pinned).await?;
    let model_id = RepoId::parse(model_id).unwrap();
    let target = Target {
        cache_dir: cache,
        model_id: &model_id,
        revision: "main",
        limits: Limits::default(),
        check_space: true,
    };
    puller.pull_model(&inspected, &target).await.map(|_| ())
}

/// Every path below `dir` (files, links and directories), relative.
fn paths(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            out.push(e.path().strip_prefix(dir).unwrap().to_path_buf());
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Nothing published for `folder` in `cache`: no snapshot, no ref, and no blob but the
/// verified ones in `kept` (layers complete before the refused one: a retry skips them);
/// temporary files gone too.
fn nothing_published(cache: &Path, folder: &str, kept: &[String]) {
    let repo = cache.join(folder);
    for sub in ["snapshots", "refs"] {
        let left = paths(&repo.join(sub));
        assert!(left.is_empty(), "{sub}: {left:?}");
    }
    let blobs: Vec<String> = paths(&repo.join("blobs"))
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(blobs, kept, "blobs");
}

use kubeairunway_modelcache_hub::testing::{judge, python};

/// `snapshot_download` and `hf_hub_download` of `repo` at `rev`, offline: sha256 of every
/// file, by path.
const OFFLINE_PY: &str = r#"
import hashlib, json, os, sys
from huggingface_hub import snapshot_download, hf_hub_download
repo, rev, cache, single = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
folder = snapshot_download(repo, revision=rev, cache_dir=cache, local_files_only=True)
def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()
walked = {}
for root, _, names in os.walk(folder):
    for n in names:
        p = os.path.join(root, n)
        walked[os.path.relpath(p, folder)] = sha(p)
one = sha(hf_hub_download(repo, single, revision=rev, cache_dir=cache, local_files_only=True))
print(json.dumps({"folder": folder, "walked": walked, "single": one}))
"#;

fn offline(py: &Path, repo: &str, rev: &str, cache: &Path, single: &str) -> serde_json::Value {
    python(
        py,
        OFFLINE_PY,
        &[repo, rev, cache.to_str().unwrap(), single],
        &[("HF_HUB_OFFLINE", "1")],
    )
}

/// A ModelPack artifact (raw weight and config, a plain tar of docs, a gzip tar of code, a
/// zstd tar of data)
/// pulled by the CLI is read offline by huggingface_hub under the model id, at `main` and
/// at the snapshot id; a second pull downloads nothing. A KitOps ModelKit too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modelpack_artifact_is_pulled_and_read_offline_by_huggingface_hub() {
    let registry = start_registry("oci-model-good").unwrap();
    let big = weight(3 << 20, 7);
    let config = br#"{"architectures":["Tiny"]}"#.to_vec();
    let (readme, notes) = (b"# tiny\n".to_vec(), b"notes\n".to_vec());
    let code = b"print('hi')\n".to_vec();
    let data = b"{\"text\": \"hi\"}\n".repeat(100);
    let layers = [
        layer(big.clone(), RAW, Some("model.safetensors")),
        layer(config.clone(), CONFIG_RAW, Some("config.json")),
        layer(
            tar(&[("README.md", &readme), ("docs/notes.txt", &notes)], false),
            DOC_TAR,
            Some("README.md"),
        ),
        layer(tar(&[("code/run.py", &code)], true), CODE_TAR_GZIP, None),
        layer(
            ruzstd::encoding::compress_to_vec(
                &tar(&[("data/train.jsonl", &data)], false)[..],
                ruzstd::encoding::CompressionLevel::Fastest,
            ),
            DATASET_TAR_ZSTD,
            None,
        ),
    ];
    let pinned = push_modelpack(&registry, "models/acme/tiny:v1", &layers).await;
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().to_str().unwrap();
    let source = format!("oci://{pinned}");
    let args = [
        "cache",
        "model",
        "pull",
        &source,
        "--cache-dir",
        dir,
        "--plain-http-registry",
        registry.addr(),
        "-o",
        "json",
    ];
    let (code_, out, err) = kubeairunway(&args).await;
    assert_eq!(code_, 0, "{out}\n{err}");
    let pulled: serde_json::Value = serde_json::from_str(&out).unwrap();
    let digest = pinned.split_once('@').unwrap().1;
    let snapshot_id = digest.strip_prefix("sha256:").unwrap()[..40].to_string();
    assert_eq!(
        pulled["modelId"], "acme/tiny",
        "the repository's last two segments"
    );
    assert_eq!(pulled["commit"], snapshot_id.as_str());
    assert_eq!(pulled["files"], 6);
    assert!(pulled["bytesReceived"].as_u64().unwrap() > 3 << 20);
    let repo = cache.path().join("models--acme--tiny");
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        snapshot_id
    );
    // The raw weight's blob is named by its digest, as the hub names LFS files.
    assert!(repo.join("blobs").join(sha(&big)).is_file());

    let expected = json!({
        "model.safetensors": sha(&big),
        "config.json": sha(&config),
        "README.md": sha(&readme),
        "docs/notes.txt": sha(&notes),
        "code/run.py": sha(&code),
        "data/train.jsonl": sha(&data),
    });
    if let Some(py) = judge() {
        for rev in ["main", snapshot_id.as_str()] {
            let read = offline(&py, "acme/tiny", rev, cache.path(), "config.json");
            assert_eq!(read["walked"], expected, "{rev}");
            assert_eq!(read["single"], sha(&config));
            assert!(
                read["folder"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!("snapshots/{snapshot_id}"))
            );
        }
    }

    // Again: everything is there, nothing is downloaded.
    let (code_, out, err) = kubeairunway(&args).await;
    assert_eq!(code_, 0, "{out}\n{err}");
    let again: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(again["bytesReceived"], 0);

    // A KitOps ModelKit: its tar layers, under the model id it is given.
    let kit = [
        layer(
            tar(&[("model/weights.bin", &big)], false),
            "application/vnd.kitops.modelkit.model.v1.tar",
            None,
        ),
        layer(
            tar(&[("docs/README.md", &readme)], true),
            "application/vnd.kitops.modelkit.docs.v1.tar+gzip",
            None,
        ),
    ];
    let kit = push(&registry, "kits/tiny:v1", None, KITOPS_CONFIG, &kit).await;
    pull(&registry, &kit, cache.path(), "kit/tiny")
        .await
        .unwrap();
    let snapshots = cache.path().join("models--kit--tiny/snapshots");
    let snapshot = std::fs::read_dir(&snapshots)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert_eq!(
        std::fs::read(snapshot.join("model/weights.bin")).unwrap(),
        big
    );
    assert_eq!(
        std::fs::read(snapshot.join("docs/README.md")).unwrap(),
        readme
    );
}

/// A blob that is not what its digest says (a raw layer, and a plain tar whose entries
/// still parse) is refused with `VerificationFailed`, and nothing is published: no
/// snapshot, no ref, not even a blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_blob_is_refused_and_nothing_is_published() {
    let registry = start_registry("oci-model-tampered").unwrap();
    let docs = tar(&[("README.md", &weight(4096, 1))], false);
    for (name, data, media_type) in [("raw", weight(1 << 20, 3), RAW), ("tar", docs, DOC_TAR)] {
        let layers = [
            layer(b"{}".to_vec(), CONFIG_RAW, Some("config.json")),
            layer(data.clone(), media_type, Some("model.safetensors")),
        ];
        let pinned = push_modelpack(&registry, &format!("models/acme/{name}:v1"), &layers).await;
        let hex = sha(&data);
        let stored = registry
            .storage()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(&hex)
            .join("data");
        let mut bytes = std::fs::read(&stored).unwrap();
        // Inside the file content (the tar's first entry), not its structure.
        bytes[600] ^= 0xff;
        std::fs::write(&stored, bytes).unwrap();
        let cache = tempfile::tempdir().unwrap();
        let err = pull(&registry, &pinned, cache.path(), "acme/m")
            .await
            .unwrap_err();
        assert_eq!(
            oci_reason(&err),
            reasons::VERIFICATION_FAILED,
            "{name}: {err}"
        );
        assert!(err.to_string().contains("digest mismatch"), "{err}");
        nothing_published(cache.path(), "models--acme--m", &[sha(b"{}")]);
    }
}

/// Tar layers that try to leave the cache (`..`, an absolute path, a symbolic link out)
/// are refused with `UnsafeArchive`; nothing is published and nothing is written outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_tar_is_refused() {
    let registry = start_registry("oci-model-hostile").unwrap();
    let cases = [
        (
            "parent",
            hostile_tar("../../escaped", tar::EntryType::Regular, None),
        ),
        (
            "absolute",
            hostile_tar("/tmp/escaped", tar::EntryType::Regular, None),
        ),
        (
            "symlink",
            hostile_tar("passwd", tar::EntryType::Symlink, Some("/etc/passwd")),
        ),
    ];
    for (name, data) in cases {
        let layers = [layer(data, DOC_TAR, None)];
        let pinned = push_modelpack(&registry, &format!("models/acme/{name}:v1"), &layers).await;
        let outer = tempfile::tempdir().unwrap();
        let cache = outer.path().join("hub");
        let err = pull(&registry, &pinned, &cache, "acme/m")
            .await
            .unwrap_err();
        assert_eq!(oci_reason(&err), reasons::UNSAFE_ARCHIVE, "{name}: {err}");
        nothing_published(&cache, "models--acme--m", &[]);
        assert_eq!(
            paths(outer.path())
                .iter()
                .filter(|p| p.ends_with("escaped"))
                .count(),
            0
        );
    }
}

/// A layer media type that is not read (a zip) and an artifact that is not a model are
/// refused before any layer is downloaded, naming what was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_layer_type_is_refused_with_a_clear_reason() {
    let registry = start_registry("oci-model-unsupported").unwrap();
    let zip = "application/vnd.cncf.model.weight.v1.zip";
    let pinned = push_modelpack(
        &registry,
        "models/acme/zip:v1",
        &[layer(b"x".to_vec(), zip, None)],
    )
    .await;
    let cache = tempfile::tempdir().unwrap();
    let err = pull(&registry, &pinned, cache.path(), "acme/m")
        .await
        .unwrap_err();
    assert_eq!(oci_reason(&err), reasons::UNSUPPORTED_MEDIA_TYPE, "{err}");
    assert!(err.to_string().contains(zip), "{err}");
    assert!(
        !cache.path().join("models--acme--m").exists(),
        "nothing downloaded"
    );

    let image = push(
        &registry,
        "images/app:v1",
        None,
        "application/vnd.oci.image.config.v1+json",
        &[layer(
            tar(&[("a", b"a")], true),
            "application/vnd.oci.image.layer.v1.tar+gzip",
            None,
        )],
    )
    .await;
    let err = pull(&registry, &image, cache.path(), "acme/m")
        .await
        .unwrap_err();
    assert_eq!(oci_reason(&err), reasons::INVALID_ARTIFACT, "{err}");
    assert!(err.to_string().contains("not a model artifact"), "{err}");
}

/// A ModelCache of an `oci://` source goes Ready on a real agent (the snapshot under its
/// model id, the snapshot id as its commit); one of an artifact with a zip layer fails
/// with `UnsupportedMediaType`, and one from a registry the agent does not allow with
/// `RegistryNotAllowed`; the controller adds that up into each ModelCache's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oci_model_cache_goes_ready_through_the_agent() {
    let registry = start_registry("oci-model-agent").unwrap();
    let big = weight(1 << 20, 9);
    let good = push_modelpack(
        &registry,
        "models/acme/tiny:v1",
        &[
            layer(big.clone(), RAW, Some("model.safetensors")),
            layer(b"{}".to_vec(), CONFIG_RAW, Some("config.json")),
        ],
    )
    .await;
    let zip = push_modelpack(
        &registry,
        "models/acme/zip:v1",
        &[layer(
            b"x".to_vec(),
            "application/vnd.cncf.model.weight.v1.zip",
            None,
        )],
    )
    .await;
    let (cluster, client) = setup("mc-oci").await;
    node(&client, "oci-a", "a").await;
    let hub = StandIn::start().await;
    let root = tempfile::tempdir().unwrap();
    let addr = registry.addr().to_string();
    let agent = start_agent_with(&client, "oci-a", root.path(), &hub, |m| {
        m.plain_http = vec![addr.clone()];
        m.allowed = kubeairunway_kernelcache_artifact::allow::AllowedRegistries::new(vec![
            addr.parse().unwrap(),
        ]);
    });
    model_cache(
        &client,
        "tiny",
        json!({"source": format!("oci://{good}"), "modelId": "Acme/Tiny-OCI"}),
    )
    .await
    .unwrap();
    model_cache(&client, "zip", json!({"source": format!("oci://{zip}")}))
        .await
        .unwrap();
    let elsewhere = format!("oci://other.example/acme/m@sha256:{}", "c".repeat(64));
    model_cache(&client, "elsewhere", json!({"source": elsewhere}))
        .await
        .unwrap();
    // The agents pull an oci:// digest only once the controller let it through: without
    // a KernelCachePolicy, by its digest only.
    let (_identity, stop, controller) = start_controller(&cluster, &client).await;
    let snapshot_id = good.split_once("@sha256:").unwrap().1[..40].to_string();
    let entries = eventually(120, "the oci caches' states", || async {
        let nodes: kube::Api<kubeairunway_kernelcache_api::KernelCacheNode> =
            kube::Api::all(client.clone());
        let status = nodes.get("oci-a").await.ok()?.status?;
        let by_name: BTreeMap<String, _> = status
            .model_caches
            .into_iter()
            .map(|e| (e.name.clone(), e))
            .collect();
        let settled = ["tiny", "zip", "elsewhere"].iter().all(|n| {
            by_name
                .get(*n)
                .is_some_and(|e| e.state != ModelCacheState::Downloading)
        });
        settled.then_some(by_name)
    })
    .await
    .unwrap();
    let tiny = &entries["tiny"];
    assert_eq!(tiny.state, ModelCacheState::Ready, "{tiny:?}");
    assert_eq!(tiny.commit.as_deref(), Some(snapshot_id.as_str()));
    let snapshot = root
        .path()
        .join("models/hub/models--Acme--Tiny-OCI/snapshots")
        .join(&snapshot_id);
    assert_eq!(
        std::fs::read(snapshot.join("model.safetensors")).unwrap(),
        big
    );
    let zip = &entries["zip"];
    assert_eq!(
        (zip.state, zip.reason.as_deref()),
        (
            ModelCacheState::Failed,
            Some(reasons::UNSUPPORTED_MEDIA_TYPE)
        ),
        "{zip:?}"
    );
    let elsewhere = &entries["elsewhere"];
    assert_eq!(
        (elsewhere.state, elsewhere.reason.as_deref()),
        (ModelCacheState::Failed, Some(reasons::REGISTRY_NOT_ALLOWED)),
        "{elsewhere:?}"
    );
    // The controller's status of each: the commit, the size and the node's reason.
    let s = cache_where(&client, "tiny", "tiny Ready", |s| s.ready_nodes == 1).await;
    assert_eq!(
        condition(&s, conditions::READY),
        Some(("True", reasons::READY))
    );
    assert_eq!(
        condition(&s, conditions::VERIFIED),
        Some(("True", reasons::DIGEST_ONLY))
    );
    assert_eq!(
        s.verified_digest.as_deref(),
        good.rsplit_once('@').map(|(_, d)| d)
    );
    assert_eq!(s.resolved_commit.as_deref(), Some(snapshot_id.as_str()));
    assert_eq!(s.size_bytes, Some((1 << 20) + 2), "the layers' bytes");
    for (name, reason) in [
        ("zip", reasons::UNSUPPORTED_MEDIA_TYPE),
        ("elsewhere", reasons::REGISTRY_NOT_ALLOWED),
    ] {
        let s = cache_where(&client, name, "failed", |s| s.failed_nodes == 1).await;
        assert_eq!(
            condition(&s, conditions::ACCEPTED),
            Some(("True", reasons::ACCEPTED))
        );
        assert_eq!(
            condition(&s, conditions::READY),
            Some(("False", reason)),
            "{name}"
        );
    }
    let _ = stop.send(());
    controller.await.unwrap().unwrap();
    agent.stop().await;
}

/// Three ModelPack artifacts pushed to `registry`: one signed with a new key, one
/// unsigned, one signed by another key; and the KernelCachePolicy `default` trusting the
/// new key.
struct Artifacts {
    signed: String,
    unsigned: String,
    wrong: String,
    policy: serde_json::Value,
}

async fn signed_artifacts(registry: &Registry) -> Artifacts {
    use kubeairunway_e2e::cache_images::{new_signer, sign};
    let artifact = |seed| vec![layer(weight(4096, seed), RAW, Some("model.safetensors"))];
    let signed = push_modelpack(registry, "models/acme/signed:v1", &artifact(1)).await;
    let unsigned = push_modelpack(registry, "models/acme/unsigned:v1", &artifact(2)).await;
    let wrong = push_modelpack(registry, "models/acme/wrong:v1", &artifact(3)).await;
    let (signer, public) = new_signer().unwrap();
    let (other_signer, _) = new_signer().unwrap();
    sign(registry, &signed, signer).await.unwrap();
    sign(registry, &wrong, other_signer).await.unwrap();
    Artifacts {
        signed,
        unsigned,
        wrong,
        policy: json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCachePolicy",
            "metadata": {"name": "default"},
            "spec": {"mode": "key", "publicKeys": [public]},
        }),
    }
}

/// Under a `KernelCachePolicy`, the controller verifies an `oci://` source's pinned digest
/// as it does a KernelCache's image (cosign signatures in the same registry, real keys),
/// from a registry that requires credentials (401 without them or with wrong ones): the
/// signed artifact, pulled with registry credentials from a docker config Secret handed
/// over to the agent, goes Ready; an unsigned one and one signed by an untrusted key are
/// `Ready=False`/`VerificationFailed`, and the agent pulls nothing of them. A Secret
/// without an entry for the registry is `CredentialsMissing`; one with a wrong password
/// is refused by the registry, and nothing is pulled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oci_model_caches_are_verified_under_the_policy_and_pulled_with_credentials() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    use kubeairunway_e2e::cache_images::start_registry_with_user;
    use kubeairunway_kernelcache_api::KernelCachePolicy;
    use kubeairunway_kernelcache_api::names::model_token_secret;
    use kubeairunway_kernelcache_artifact::sealed::node_secret_name;

    let registry = start_registry_with_user("oci-model-verify", "robot", "pw").unwrap();
    let addr = registry.addr().to_string();
    let Artifacts {
        signed,
        unsigned,
        wrong,
        policy,
    } = signed_artifacts(&registry).await;

    let (cluster, client) = setup("mc-oci-verify").await;
    node(&client, "oci-v", "a").await;
    Api::<KernelCachePolicy>::all(client.clone())
        .patch(
            "default",
            &PatchParams::apply("user"),
            &Patch::Apply(policy),
        )
        .await
        .unwrap();
    let config = json!({"auths": {addr.clone(): {"username": "robot", "password": "pw"}}});
    let elsewhere = json!({"auths": {"other.example": {"username": "u", "password": "p"}}});
    let wrong_password =
        json!({"auths": {addr.clone(): {"username": "robot", "password": "nope"}}});
    for (name, config) in [
        ("regcred", config),
        ("othercred", elsewhere),
        ("badcred", wrong_password),
    ] {
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": {".dockerconfigjson": config.to_string()},
        });
        Api::<Secret>::namespaced(client.clone(), crate::modelcache::NS)
            .create(
                &PostParams::default(),
                &serde_json::from_value(secret).unwrap(),
            )
            .await
            .unwrap();
    }
    // A token an earlier version handed over in the clear (one Secret per cache): the
    // controller deletes it at start.
    let stale_name = model_token_secret(crate::modelcache::NS, "signed");
    let stale = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": stale_name,
            "labels": {"app.kubernetes.io/managed-by": "kernelcache-controller"},
            "annotations": {"cache.kubeairunway.ai/for": format!("{}/signed", crate::modelcache::NS)}},
        "type": "Opaque", "stringData": {"token": "hf_old"},
    });
    Api::<Secret>::namespaced(client.clone(), "kernelcache-credentials")
        .create(
            &PostParams::default(),
            &serde_json::from_value(stale).unwrap(),
        )
        .await
        .unwrap();
    let (_identity, stop, controller) =
        crate::modelcache::start_controller_with(&cluster, &client, |s| {
            s.plain_http = vec![addr.clone()];
        })
        .await;
    let hub = StandIn::start().await;
    let root = tempfile::tempdir().unwrap();
    let agent = start_agent_with(&client, "oci-v", root.path(), &hub, |m| {
        m.plain_http = vec![addr.clone()];
    });
    for (name, pinned, secret) in [
        ("signed", &signed, Some("regcred")),
        ("unsigned", &unsigned, Some("regcred")),
        ("wrong", &wrong, Some("regcred")),
        ("nocred", &signed, Some("othercred")),
        ("badpass", &signed, Some("badcred")),
    ] {
        let mut spec = json!({"source": format!("oci://{pinned}")});
        if let Some(secret) = secret {
            spec["credentialsSecretRef"] = json!({"name": secret});
            spec["modelId"] = json!(format!("acme/{name}"));
        }
        model_cache(&client, name, spec).await.unwrap();
    }

    let s = cache_where(&client, "signed", "signed Ready", |s| s.ready_nodes == 1).await;
    assert_eq!(
        condition(&s, conditions::READY),
        Some(("True", reasons::READY))
    );
    assert_eq!(
        condition(&s, conditions::VERIFIED),
        Some(("True", reasons::VERIFIED))
    );
    assert!(s.verification.as_ref().is_some_and(|v| v.verified), "{s:?}");
    assert_eq!(
        s.verified_digest.as_deref(),
        signed.rsplit_once('@').map(|(_, d)| d)
    );
    // The credentials reached the agent through the controller's copy, sealed to the
    // node's key in the node's Secret (the pull above opened it); nothing in the clear.
    let creds = Api::<Secret>::namespaced(client.clone(), "kernelcache-credentials");
    let mut expected: Vec<String> = ["signed", "unsigned", "wrong", "badpass"]
        .iter()
        .map(|c| model_token_secret(crate::modelcache::NS, c))
        .collect();
    expected.sort();
    // The caches whose credentials could be read (not nocred's).
    let data = eventually(60, "the node's sealed entries", || async {
        let data = creds
            .get(&node_secret_name("oci-v"))
            .await
            .ok()?
            .data
            .unwrap_or_default();
        (data.keys().cloned().collect::<Vec<_>>() == expected).then_some(data)
    })
    .await
    .unwrap();
    let sealed = String::from_utf8_lossy(&data[&stale_name].0).to_string();
    assert!(
        !sealed.contains("robot") && !sealed.contains("auths"),
        "{sealed}"
    );
    assert!(
        creds.get_opt(&stale_name).await.unwrap().is_none(),
        "the earlier version's Secret in the clear is deleted"
    );
    let hub_dir = root.path().join("models/hub");
    assert!(hub_dir.join("models--acme--signed/snapshots").is_dir());

    for (name, why) in [
        ("unsigned", "no signature found"),
        ("wrong", "no signature by a trusted key"),
    ] {
        let s = cache_where(&client, name, "refused", |s| {
            condition(s, conditions::READY).is_some_and(|c| c.1 == reasons::VERIFICATION_FAILED)
        })
        .await;
        let verified = s
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::VERIFIED)
            .unwrap();
        assert_eq!(
            (verified.status.as_str(), verified.reason.as_str()),
            ("False", reasons::VERIFICATION_FAILED),
            "{name}"
        );
        assert!(verified.message.contains(why), "{name}: {verified:?}");
        assert_eq!(s.verified_digest, None, "{name}");
    }
    // The agent reports them refused, and wrote nothing of them on the node.
    let entries = eventually(60, "the refusals on the node", || async {
        let nodes: kube::Api<kubeairunway_kernelcache_api::KernelCacheNode> =
            kube::Api::all(client.clone());
        let status = nodes.get("oci-v").await.ok()?.status?;
        let refused: Vec<_> = status
            .model_caches
            .into_iter()
            .filter(|e| e.name == "unsigned" || e.name == "wrong")
            .filter(|e| e.reason.as_deref() == Some(reasons::VERIFICATION_FAILED))
            .collect();
        (refused.len() == 2).then_some(refused)
    })
    .await
    .unwrap();
    for e in &entries {
        assert_eq!(e.state, ModelCacheState::Failed, "{e:?}");
        assert_eq!(e.bytes_done, None, "{e:?}");
    }
    for folder in ["models--acme--unsigned", "models--acme--wrong"] {
        assert!(
            !hub_dir.join(folder).exists(),
            "{folder} written on the node"
        );
    }
    let s = cache_where(&client, "nocred", "credentials missing", |s| {
        condition(s, conditions::ACCEPTED).is_some_and(|c| c.1 == reasons::CREDENTIALS_MISSING)
    })
    .await;
    assert_eq!(s.verified_digest, None, "no verdict without credentials");
    assert!(!hub_dir.join("models--acme--nocred").exists());
    let s = cache_where(&client, "badpass", "refused by the registry", |s| {
        condition(s, conditions::READY).is_some_and(|c| c.0 == "False")
            && s.conditions.iter().any(|c| c.message.contains("401"))
    })
    .await;
    assert_eq!(s.verified_digest, None, "{s:?}");
    assert!(!hub_dir.join("models--acme--badpass").exists());
    let _ = stop.send(());
    controller.await.unwrap().unwrap();
    agent.stop().await;
}

/// `cache model pull --policy-file` verifies an `oci://` artifact as the kernel-cache
/// controller verifies a ModelCache before any node pulls it: a signed artifact is pulled;
/// an unsigned one and one signed by an untrusted key are refused with exit code 1 and
/// nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_verifies_an_oci_artifact_under_a_policy_before_pulling_it() {
    let registry = start_registry("oci-model-cli-verify").unwrap();
    let Artifacts {
        signed,
        unsigned,
        wrong,
        policy: trusted,
    } = signed_artifacts(&registry).await;
    let files = tempfile::tempdir().unwrap();
    let policy = files.path().join("policy.yaml");
    std::fs::write(&policy, serde_json::to_string(&trusted).unwrap()).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let pull = |pinned: &str| {
        let source = format!("oci://{pinned}");
        let cache = cache.path().to_str().unwrap().to_string();
        let policy = policy.to_str().unwrap().to_string();
        let addr = registry.addr().to_string();
        async move {
            kubeairunway(&[
                "cache",
                "model",
                "pull",
                &source,
                "--cache-dir",
                &cache,
                "--plain-http-registry",
                &addr,
                "--policy-file",
                &policy,
            ])
            .await
        }
    };
    let (code, out, err) = pull(&signed).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.contains("verified: signed by"), "{err}");
    assert!(cache.path().join("models--acme--signed/snapshots").is_dir());
    for (pinned, folder, why) in [
        (&unsigned, "models--acme--unsigned", "no signature found"),
        (
            &wrong,
            "models--acme--wrong",
            "no signature by a trusted key",
        ),
    ] {
        let (code, out, err) = pull(pinned).await;
        assert_eq!(code, 1, "{out}\n{err}");
        assert!(
            err.contains("refused by") && err.contains(why) && err.contains("nothing pulled"),
            "{err}"
        );
        assert!(!cache.path().join(folder).exists(), "{folder} written");
    }
}
