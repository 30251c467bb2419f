//! Fault tests of the node agent as a process: the `kernelcache-agent` binary, killed
//! with SIGKILL while it stages a cache and while it rewrites Triton group files, then
//! started again. At every moment a cache directory is absent or complete; after the
//! restart it is identical to a clean extraction of the same image (file for file, byte
//! for byte). And the agent as its chart runs it: the cache root handed to a non-root user
//! by `kernelcache-own-roots` with CAP_CHOWN alone, then the agent as that user with no
//! capability. Real API server (`kubeairunway-testcluster`), real loopback registry.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failing loudly is the point

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use flate2::Compression;
use flate2::write::GzEncoder;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kubeairunway_kernelcache_api::{CacheState, KernelCache, KernelCacheNode};
use kubeairunway_kernelcache_artifact::extract::Limits;
use kubeairunway_kernelcache_artifact::oci::{Puller, pin};
use kubeairunway_testcluster::registry::Registry;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{IMAGE_CONFIG_MEDIA_TYPE, IMAGE_LAYER_GZIP_MEDIA_TYPE};
use oci_client::secrets::RegistryAuth;
use serde_json::json;

const NS: &str = "ml";
const GPUS: &str = "- {name: NVIDIA H100 80GB HBM3, backend: cuda, arch: '9.0'}\n";

/// A Triton cache of `kernels` hash directories, each with a kernel (`bytes` bytes of
/// varied content) and a group file naming it by a producer's absolute path.
fn triton_layer(kernels: usize, bytes: usize) -> Vec<u8> {
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
    let mut add = |path: &str, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, path, data).unwrap();
    };
    for k in 0..kernels {
        let hash = format!("HASH{k:05}");
        let kernel: Vec<u8> = (0..bytes)
            .map(|i| u8::try_from((i * 31 + k * 7) % 251).unwrap_or_default())
            .collect();
        add(&format!("io.triton.cache/{hash}/k.cubin"), &kernel);
        let group =
            json!({"child_paths": {"k.cubin": format!("/workspace/.triton/cache/{hash}/k.cubin")}});
        add(
            &format!("io.triton.cache/{hash}/__grp__k.json"),
            &serde_json::to_vec(&group).unwrap(),
        );
    }
    let manifest = json!({"triton": [{"hash": "HASH00000", "backend": "cuda", "arch": "90", "warp_size": 32}]});
    add(
        "io.triton.manifest/manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    builder.into_inner().unwrap().finish().unwrap()
}

async fn push(registry: &Registry, layer: Vec<u8>) -> String {
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Labels": {
            "cache.triton.image/summary": r#"{"targets":[{"backend":"cuda","arch":"90","warp_size":32}]}"#,
        }},
        "rootfs": {"type": "layers", "diff_ids": []},
    }))
    .unwrap();
    let reference: oci_client::Reference = format!("{}/faults/triton:v1", registry.addr())
        .parse()
        .unwrap();
    oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..ClientConfig::default()
    })
    .push(
        &reference,
        &[ImageLayer::new(
            layer,
            IMAGE_LAYER_GZIP_MEDIA_TYPE.into(),
            None,
        )],
        Config::new(config, IMAGE_CONFIG_MEDIA_TYPE.into(), None),
        &RegistryAuth::Anonymous,
        None,
    )
    .await
    .unwrap();
    let puller = Puller::new(RegistryAuth::Anonymous, vec![registry.addr().to_string()]);
    let digest = puller.resolve(&reference.to_string()).await.unwrap();
    pin(&reference.to_string(), &digest).unwrap()
}

/// Create the KernelCache and write its status as the controller would.
async fn cache(client: &Client, name: &str, pinned: &str, mount: &str) {
    let api: Api<KernelCache> = Api::namespaced(client.clone(), NS);
    let image = pinned.split('@').next().unwrap().to_string() + ":v1";
    api.patch(
        name,
        &PatchParams::apply("user"),
        &Patch::Apply(json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCache",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"image": image, "mount": {"path": mount}},
        })),
    )
    .await
    .unwrap();
    let digest = pinned.split_once('@').unwrap().1;
    api.patch_status(
        name,
        &PatchParams::apply("kernelcache-controller").force(),
        &Patch::Apply(json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCache",
            "metadata": {"name": name, "namespace": NS},
            "status": {"resolvedDigest": digest, "pinnedImage": pinned,
                       "verification": {"mode": "key", "verified": true}},
        })),
    )
    .await
    .unwrap();
}

struct Agent {
    child: Child,
}

impl Agent {
    fn start(kubeconfig: &Path, root: &Path, registry: &Registry, work: &Path) -> Self {
        Self::start_under(&[], kubeconfig, root, registry, work)
    }

    /// Started by `wrapper` (e.g. `setpriv` with its flags), which then runs the agent.
    fn start_under(
        wrapper: &[&str],
        kubeconfig: &Path,
        root: &Path,
        registry: &Registry,
        work: &Path,
    ) -> Self {
        let inventory = work.join("gpus.yaml");
        std::fs::write(&inventory, GPUS).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(work.join("agent.log"))
            .unwrap();
        let agent = env!("CARGO_BIN_EXE_kernelcache-agent");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(agent);
                c
            }
            None => Command::new(agent),
        };
        let child = command
            .args([
                "--node-name=fault-node",
                "--resync=1s",
                "--metrics-bind-address=",
                "--log-format=text",
                // The test machine's disk may be fuller than the default floor allows.
                "--min-free=1Mi",
            ])
            .arg(format!("--cache-root={}", root.display()))
            .arg(format!("--gpu-inventory={}", inventory.display()))
            .arg(format!("--plain-http-registry={}", registry.addr()))
            .env("KUBECONFIG", kubeconfig)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Self { child }
    }

    /// SIGKILL, no chance to clean up.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every path under `dir` with its content (directories empty), links refused.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let meta = e.path().symlink_metadata().unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().to_path_buf();
            assert!(!meta.file_type().is_symlink(), "a link: {}", rel.display());
            if meta.is_dir() {
                stack.push(e.path());
                out.insert(rel, Vec::new());
            } else {
                out.insert(rel, std::fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

/// A clean extraction of `pinned` for the mount path `mount`.
async fn clean(registry: &Registry, pinned: &str, mount: &str) -> BTreeMap<PathBuf, Vec<u8>> {
    let root = tempfile::tempdir().unwrap();
    let puller = Puller::new(RegistryAuth::Anonymous, vec![registry.addr().to_string()]);
    let staged = puller
        .stage(
            pinned,
            root.path(),
            NS,
            "clean",
            Some(mount),
            Limits::default(),
        )
        .await
        .unwrap();
    tree(&staged.dir)
}

async fn state(client: &Client) -> Option<CacheState> {
    let api: Api<KernelCacheNode> = Api::all(client.clone());
    let node = api.get_opt("fault-node").await.ok().flatten()?;
    node.status?
        .caches
        .iter()
        .find(|c| c.name == "triton")
        .map(|c| c.state)
}

async fn wait_ready(client: &Client, work: &Path) {
    for _ in 0..600 {
        if state(client).await == Some(CacheState::Ready) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "not Ready after 60 s; agent log:\n{}",
        std::fs::read_to_string(work.join("agent.log")).unwrap_or_default()
    );
}

/// Poll `check` every millisecond (up to 60 s).
async fn when(what: &str, check: impl Fn() -> bool) {
    for _ in 0..60_000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("never saw {what}");
}

#[tokio::test]
async fn sigkill_during_staging_and_during_the_rewrite_leaves_absent_or_complete_caches() {
    let (cluster, client) = kubeairunway_sdk::testing::private_cluster(
        "kc-faults",
        &kubeairunway_kernelcache_api::crds(),
    )
    .await
    .unwrap();
    cluster.ensure_namespace(NS);
    let registry = Registry::start(
        &kubeairunway_testcluster::cache_dir()
            .join("runs")
            .join(format!("{}-registry-faults", std::process::id())),
    )
    .unwrap();
    // Large enough that staging and rewriting take a while on this machine.
    let pinned = push(&registry, triton_layer(3000, 8 << 10)).await;
    let digest_dir = pinned.split_once('@').unwrap().1.replace(':', "-");
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    let target = root.join(NS).join("triton").join(&digest_dir);
    let first_mount = "/cache/first";
    cache(&client, "triton", &pinned, first_mount).await;
    let expected = clean(&registry, &pinned, first_mount).await;

    // 1. Killed while staging (the download or the extraction under way).
    let agent = Agent::start(cluster.kubeconfig(), &root, &registry, work.path());
    let staging_root = root.clone();
    when("staging under way", || {
        std::fs::read_dir(&staging_root).is_ok_and(|d| {
            d.flatten().any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with(".staging-")
                    || (n == ".downloads"
                        && std::fs::read_dir(e.path()).is_ok_and(|mut f| f.next().is_some()))
            })
        })
    })
    .await;
    agent.kill();
    let after_kill = target.exists().then(|| tree(&target));
    assert!(
        after_kill.is_none() || after_kill.as_ref() == Some(&expected),
        "a cache directory half there after SIGKILL"
    );
    let agent = Agent::start(cluster.kubeconfig(), &root, &registry, work.path());
    wait_ready(&client, work.path()).await;
    assert_eq!(tree(&target), expected, "identical to a clean extraction");
    let leftovers: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".staging-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // 2. Killed while rewriting the group files for a new mount path.
    let second_mount = "/cache/second";
    cache(&client, "triton", &pinned, second_mount).await;
    let rewritten = target.join("io.triton.cache/HASH00000/__grp__k.json");
    let last = target.join("io.triton.cache/HASH02999/__grp__k.json");
    when("the rewrite under way", || {
        std::fs::read_to_string(&rewritten).is_ok_and(|t| t.contains(second_mount))
    })
    .await;
    agent.kill();
    // Whether the killed rewrite had renamed every group file into place (directories are
    // read in no particular order, so no single file tells).
    let done_before_kill = tree(&target).iter().all(|(path, content)| {
        !path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .starts_with("__grp__")
            || String::from_utf8_lossy(content).contains(second_mount)
    });
    // Every group file is whole: the old one or the new one (a temporary file of the
    // interrupted rewrite may remain beside it, under a name Triton never reads; the
    // restarted agent removes it).
    for (path, content) in tree(&target) {
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if file.starts_with("__grp__") {
            let group: serde_json::Value = serde_json::from_slice(&content)
                .unwrap_or_else(|e| panic!("{} is broken after SIGKILL: {e}", path.display()));
            let child = group["child_paths"]["k.cubin"].as_str().unwrap();
            assert!(
                child.starts_with(first_mount) || child.starts_with(second_mount),
                "{child}"
            );
        }
        assert!(
            !file.starts_with(".kc-replace-") || !done_before_kill,
            "a temporary file after a finished rewrite"
        );
    }
    let _agent = Agent::start(cluster.kubeconfig(), &root, &registry, work.path());
    let expected = clean(&registry, &pinned, second_mount).await;
    when("the rewrite finished after the restart", || {
        std::fs::read_to_string(&last).is_ok_and(|t| t.contains(second_mount))
    })
    .await;
    wait_ready(&client, work.path()).await;
    // The rewrite after a restart finishes what the killed one began.
    for _ in 0..100 {
        if tree(&target) == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(tree(&target), expected, "identical to a clean extraction");
    let _ = std::io::stdout().flush();
}

const AGENT_UID: u32 = 65532;

/// Whether this test can switch users: root with util-linux's `setpriv`. Outside CI a
/// machine without them skips the test (saying so); CI must run it.
fn can_switch_users() -> bool {
    let setpriv = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let root = rustix::process::geteuid().is_root();
    if setpriv && root {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must run this test as root with setpriv (util-linux)"
    );
    eprintln!("skipped: needs root and setpriv (util-linux) to run the agent as uid {AGENT_UID}");
    false
}

/// A kubeconfig the agent's user can read: the test cluster's, with its certificate and
/// key files copied beside it.
fn readable_kubeconfig(kubeconfig: &Path, dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let mut text = std::fs::read_to_string(kubeconfig).unwrap();
    for key in ["certificate-authority", "client-certificate", "client-key"] {
        let prefix = format!("{key}: ");
        let line = text
            .lines()
            .find_map(|l| l.trim().strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {key} in the kubeconfig"))
            .to_string();
        let copy = dir.join(key);
        std::fs::copy(&line, &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
        text = text.replace(&line, &copy.display().to_string());
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

/// Every path under `dir` (itself included) not owned by `uid:uid`.
fn not_owned_by(dir: &Path, uid: u32) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt as _;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = p.symlink_metadata().unwrap();
        if meta.uid() != uid || meta.gid() != uid {
            out.push(p.clone());
        }
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        }
    }
    out
}

/// The agent's pod as the chart makes it: a root-owned cache root (as the kubelet makes a
/// hostPath), holding a cache a root agent of an earlier release staged, is handed to uid
/// 65532 by `kernelcache-own-roots` with CAP_CHOWN as its only capability; the agent then
/// runs as 65532 with no capability and no new privileges: it stages a cache, removes the
/// earlier one (no longer wanted), and everything under the root is its own.
#[tokio::test]
async fn the_agent_stages_as_the_non_root_owner_of_the_cache_root() {
    use std::os::unix::fs::PermissionsExt as _;
    if !can_switch_users() {
        return;
    }
    let (cluster, client) = kubeairunway_sdk::testing::private_cluster(
        "kc-non-root",
        &kubeairunway_kernelcache_api::crds(),
    )
    .await
    .unwrap();
    cluster.ensure_namespace(NS);
    let registry = Registry::start(
        &kubeairunway_testcluster::cache_dir()
            .join("runs")
            .join(format!("{}-registry-non-root", std::process::id())),
    )
    .unwrap();
    let pinned = push(&registry, triton_layer(20, 1 << 10)).await;
    let work = tempfile::tempdir().unwrap();
    // The agent's user reaches its files through the work directory.
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let kubeconfig = readable_kubeconfig(cluster.kubeconfig(), work.path());
    let root = work.path().join("root");
    let earlier = root
        .join(NS)
        .join("old")
        .join(format!("sha256-{}", "e".repeat(64)));
    std::fs::create_dir_all(&earlier).unwrap();
    std::fs::write(earlier.join("k.cubin"), b"staged by root").unwrap();
    assert!(!not_owned_by(&root, AGENT_UID).is_empty());

    // The init container: root, CAP_CHOWN alone.
    let owned = Command::new("setpriv")
        .args([
            "--inh-caps=-all",
            "--bounding-set=-all,+chown",
            "--no-new-privs",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_kernelcache-own-roots"))
        .arg(format!("--uid={AGENT_UID}"))
        .arg(format!("--gid={AGENT_UID}"))
        .arg(&root)
        .output()
        .unwrap();
    assert!(
        owned.status.success(),
        "kernelcache-own-roots: {}",
        String::from_utf8_lossy(&owned.stderr)
    );
    assert_eq!(not_owned_by(&root, AGENT_UID), Vec::<PathBuf>::new());

    cache(&client, "triton", &pinned, "/cache/triton").await;
    let (uid, gid) = (
        format!("--reuid={AGENT_UID}"),
        format!("--regid={AGENT_UID}"),
    );
    let _agent = Agent::start_under(
        &[
            "setpriv",
            &uid,
            &gid,
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ],
        &kubeconfig,
        &root,
        &registry,
        work.path(),
    );
    wait_ready(&client, work.path()).await;
    let digest_dir = pinned.split_once('@').unwrap().1.replace(':', "-");
    let staged = root.join(NS).join("triton").join(&digest_dir);
    assert!(staged.join("io.triton.cache/HASH00000/k.cubin").is_file());
    when("the earlier cache removed", || !earlier.exists()).await;
    assert_eq!(not_owned_by(&root, AGENT_UID), Vec::<PathBuf>::new());
}
