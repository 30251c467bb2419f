//! The kernel-cache node agent, in-process, against a real API server of its own (it
//! watches KernelCaches in every namespace) and a real loopback registry holding real
//! cache images. The test plays the controller: it writes each KernelCache's status
//! (pinned digest, verification) with the controller's field manager. The Node is a real
//! Node object the agent watches (it only reads it: the controller sets the ready
//! labels); GPUs come from a static inventory.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kubeairunway_e2e::cache_images::{
    CUDA_HASH, CacheImage, layer, push, start_registry, triton_cuda, triton_rocm, vllm_cuda,
};
use kubeairunway_e2e::eventually;
use kubeairunway_kernelcache_agent::gpu::Static;
use kubeairunway_kernelcache_agent::metrics::Metrics;
use kubeairunway_kernelcache_agent::node::KubeNode;
use kubeairunway_kernelcache_agent::space::Size;
use kubeairunway_kernelcache_agent::{self as agent, Seams, Settings};
use kubeairunway_kernelcache_api::{CacheState, KernelCache, KernelCacheNode, NodeCache};
use kubeairunway_kernelcache_artifact::secrets;
use kubeairunway_testcluster::TestCluster;
use kubeairunway_testcluster::registry::Registry;
use serde_json::{Value, json};

const H100X2: &str = r"
- {name: NVIDIA H100 80GB HBM3, backend: cuda, arch: '9.0'}
- {name: NVIDIA H100 80GB HBM3, backend: cuda, arch: '9.0'}
";

struct RunningAgent {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    metrics: Arc<Metrics>,
}

impl RunningAgent {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

fn start_agent(
    client: &Client,
    node_name: &str,
    root: &Path,
    registry: &Registry,
    inventory: &str,
) -> RunningAgent {
    start_agent_with(client, node_name, root, registry, inventory, |_| {})
}

fn start_agent_with(
    client: &Client,
    node_name: &str,
    root: &Path,
    registry: &Registry,
    inventory: &str,
    tweak: impl FnOnce(&mut Settings),
) -> RunningAgent {
    let mut settings = Settings::new(node_name, root.to_path_buf());
    // The test machine's disk may be fuller than the default floor (a share of the whole
    // filesystem) allows; the floor's own test sets it.
    settings.min_free = kubeairunway_kernelcache_agent::space::Size::Bytes(1 << 20);
    tweak(&mut settings);
    settings.plain_http = vec![registry.addr().to_string()];
    settings.resync = Duration::from_secs(2);
    let seams = Seams {
        gpus: Arc::new(Static::parse(inventory).unwrap()),
        node: Arc::new(KubeNode::watch(client.clone(), node_name)),
        secrets: Arc::new(secrets::KubeSecrets(client.clone())),
    };
    let metrics = Arc::new(Metrics::new(node_name));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(agent::run(
        client.clone(),
        settings,
        seams,
        Arc::clone(&metrics),
        async move {
            let _ = stopped.await;
        },
    ));
    RunningAgent {
        stop,
        task,
        metrics,
    }
}

/// The kernel-cache chart's RBAC applied to `cluster`, and the identity of its `component`
/// (`agent`, `controller`): the service account its workload runs as. `None` when helm is
/// missing outside CI.
async fn chart_identity(
    cluster: &TestCluster,
    admin: &Client,
    component: &str,
) -> Option<kubeairunway_e2e::rbac::ChartIdentity> {
    use kubeairunway_e2e::helm;
    let helm_bin = helm::require()?;
    let objects = helm::template(&helm_bin, &helm::chart("kernelcache-provider"), &[]).unwrap();
    let workload = objects
        .iter()
        .find(|o| {
            matches!(o["kind"].as_str(), Some("DaemonSet" | "Deployment"))
                && o["metadata"]["labels"]["app.kubernetes.io/component"] == component
        })
        .unwrap_or_else(|| panic!("the chart runs a {component}"));
    let account = workload["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let namespace = workload["metadata"]["namespace"].as_str().unwrap();
    let identity = kubeairunway_e2e::rbac::ChartIdentity::apply(
        cluster,
        admin,
        &objects,
        &format!("the kernel-cache {component}"),
        namespace,
        account,
    )
    .await
    .unwrap();
    if component == "agent" {
        enforce_agent_policies(cluster, admin, &objects, &identity).await;
    }
    Some(identity)
}

/// The chart's policy binding each agent to its node.
pub(crate) const AGENT_NODE_POLICY: &str = "release-kernelcache-provider-agent-node";

/// A KernelCacheNode `name` reporting on `node`, as the agent applies it.
fn report(name: &str, node: &str) -> Value {
    json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCacheNode",
           "metadata": {"name": name}, "spec": {"nodeName": node}})
}

/// Apply the agent's admission policies of the rendered chart `objects` and wait until
/// the API server enforces them: a report written as the agent's service account by
/// client certificate (no node in the credential; a dry run) is refused. The agent must
/// then run with a token bound to its node (`ChartIdentity::client_on_node`).
pub(crate) async fn enforce_agent_policies(
    cluster: &TestCluster,
    admin: &Client,
    objects: &[Value],
    identity: &kubeairunway_e2e::rbac::ChartIdentity,
) {
    let agents: Vec<Value> = objects
        .iter()
        .filter(|o| o["metadata"]["labels"]["app.kubernetes.io/component"] == "agent")
        .cloned()
        .collect();
    kubeairunway_e2e::policy::apply(admin, &agents)
        .await
        .unwrap();
    let by_certificate: Api<KernelCacheNode> = Api::all(identity.client(cluster).await.unwrap());
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::apply("probe")
    };
    let probe = Patch::Apply(report("probe", "probe"));
    kubeairunway_e2e::policy::until_denied(AGENT_NODE_POLICY, || {
        by_certificate.patch("probe", &dry_run, &probe)
    })
    .await
    .unwrap();
}

async fn setup(tag: &str) -> (TestCluster, Client, Registry) {
    let (cluster, client) =
        kubeairunway_sdk::testing::private_cluster(tag, &kubeairunway_kernelcache_api::crds())
            .await
            .unwrap();
    cluster.ensure_namespace("ml");
    (cluster, client, start_registry(tag).unwrap())
}

/// Create a KernelCache as a user would, then write its status as the controller does:
/// pinned to the digest `image` points at, verified (`verified: false` leaves it
/// unusable).
async fn cache(
    client: &Client,
    registry: &Registry,
    ns: &str,
    name: &str,
    image: &str,
    verified: bool,
) -> String {
    let api: Api<KernelCache> = Api::namespaced(client.clone(), ns);
    let body = json!({
        "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCache",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"image": image},
    });
    api.patch(name, &PatchParams::apply("user"), &Patch::Apply(&body))
        .await
        .unwrap();
    let pinned = kubeairunway_e2e::cache_images::pinned(registry, image)
        .await
        .unwrap();
    let digest = pinned.split_once('@').unwrap().1.to_string();
    let status = json!({
        "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCache",
        "metadata": {"name": name, "namespace": ns},
        "status": {
            "resolvedDigest": digest,
            "pinnedImage": pinned,
            "verification": {"mode": "key", "verified": verified},
        },
    });
    api.patch_status(
        name,
        &PatchParams::apply("kernelcache-controller").force(),
        &Patch::Apply(&status),
    )
    .await
    .unwrap();
    digest
}

fn entry<'a>(node: &'a KernelCacheNode, name: &str) -> Option<&'a NodeCache> {
    node.status.as_ref()?.caches.iter().find(|c| c.name == name)
}

async fn node_where(
    client: &Client,
    name: &str,
    what: &str,
    ready: impl Fn(&KernelCacheNode) -> bool,
) -> KernelCacheNode {
    let api: Api<KernelCacheNode> = Api::all(client.clone());
    let found = eventually(90, what, || async {
        api.get_opt(name).await.ok().flatten().filter(|n| ready(n))
    })
    .await;
    match found {
        Ok(n) => n,
        Err(e) => {
            let last = api
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|n| n.status);
            panic!("{e}; last status: {last:#?}")
        }
    }
}

fn state_of(node: &KernelCacheNode, name: &str) -> Option<CacheState> {
    entry(node, name).map(|c| c.state)
}

#[tokio::test]
async fn the_agent_stages_what_fits_reports_labels_survives_restarts_and_cleans_up() {
    let (cluster, client, registry) = setup("kc-agent").await;
    let ns = "ml";
    let triton = push(&registry, "kc/triton-vadd:v1", &triton_cuda("90").unwrap())
        .await
        .unwrap();
    let vllm = push(&registry, "kc/vllm-llama:v1", &vllm_cuda("90").unwrap())
        .await
        .unwrap();
    let rocm = push(&registry, "kc/rocm-vadd:v1", &triton_rocm(&[]).unwrap())
        .await
        .unwrap();
    let triton_digest = cache(&client, &registry, ns, "triton-vadd", &triton, true).await;
    let vllm_digest = cache(&client, &registry, ns, "vllm-llama", &vllm, true).await;
    let rocm_digest = cache(&client, &registry, ns, "rocm-vadd", &rocm, true).await;
    // The same content as the Triton cache, but its signature did not verify.
    cache(&client, &registry, ns, "unverified", &triton, false).await;
    // A cache that fits, whose layer the registry serves tampered.
    let manifest = br#"{"vllm":[{"backend":"cuda","arch":"90","warp_size":32}]}"#;
    let corrupt_image = CacheImage {
        layer: layer(&[
            (
                "io.vllm.cache/torch_compile_cache/x/rank_0_0/backbone/f",
                b"corrupt",
            ),
            ("io.vllm.manifest/manifest.json", manifest),
        ])
        .unwrap(),
        config: vllm_cuda("90").unwrap().config,
    };
    let corrupt = push(&registry, "kc/corrupt:v1", &corrupt_image)
        .await
        .unwrap();
    let layer_digest = format!(
        "{:x}",
        <sha2::Sha256 as sha2::Digest>::digest(&corrupt_image.layer)
    );
    let stored = registry
        .storage()
        .join("docker/registry/v2/blobs/sha256")
        .join(&layer_digest[..2])
        .join(&layer_digest)
        .join("data");
    let mut bytes = std::fs::read(&stored).unwrap();
    let last = bytes.len() - 20;
    bytes[last] ^= 0xff;
    std::fs::write(&stored, bytes).unwrap();
    cache(&client, &registry, ns, "corrupt", &corrupt, true).await;
    let corrupt_pinned = kubeairunway_e2e::cache_images::pinned(&registry, &corrupt)
        .await
        .unwrap();

    let root = tempfile::tempdir().unwrap();
    let node_name = "gpu-node-1";
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node_name, "labels": {"pool": "gpu"}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // A cache for other nodes only is not even considered here.
    let api: Api<KernelCache> = Api::namespaced(client.clone(), ns);
    api.patch(
        "elsewhere",
        &PatchParams::apply("user-selector"),
        &Patch::Apply(json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCache",
            "metadata": {"name": "elsewhere", "namespace": ns},
            "spec": {"image": triton, "nodeSelector": {"pool": "cpu"}},
        })),
    )
    .await
    .unwrap();
    cache(&client, &registry, ns, "elsewhere", &triton, true).await;
    // The agent runs as its DaemonSet's service account, under the RBAC the chart grants
    // it (a request the chart does not grant fails the test).
    let Some(identity) = chart_identity(&cluster, &client, "agent").await else {
        return;
    };
    let agent = identity
        .client_on_node(&cluster, &client, node_name)
        .await
        .unwrap();
    let running = start_agent(&agent, node_name, root.path(), &registry, H100X2);

    let report = node_where(
        &client,
        node_name,
        "Triton and vLLM Ready, ROCm Incompatible",
        |n| {
            state_of(n, "triton-vadd") == Some(CacheState::Ready)
                && state_of(n, "vllm-llama") == Some(CacheState::Ready)
                && state_of(n, "rocm-vadd") == Some(CacheState::Incompatible)
                && state_of(n, "corrupt") == Some(CacheState::Failed)
        },
    )
    .await;
    let status = report.status.as_ref().unwrap();
    assert_eq!(report.spec.node_name, node_name);
    assert_eq!(status.gpu_count, 2);
    assert_eq!(status.gpus[1].arch, "90");
    assert_eq!(status.gpu_detection, None);
    assert!(status.last_updated.is_some());
    let t = entry(&report, "triton-vadd").unwrap();
    assert_eq!(t.digest, triton_digest);
    assert_eq!(t.compatible_gpus, [0, 1]);
    assert!(t.size_bytes.unwrap() > 0);
    assert!(t.last_transition_time.is_some());
    let v = entry(&report, "vllm-llama").unwrap();
    assert_eq!(v.digest, vllm_digest);
    assert!(v.size_bytes.unwrap() > 0);
    let r = entry(&report, "rocm-vadd").unwrap();
    assert_eq!(r.digest, rocm_digest);
    assert!(r.compatible_gpus.is_empty());
    assert_eq!(
        r.incompatible_gpus
            .iter()
            .map(|g| (g.index, g.reason.as_str(), g.message.as_str()))
            .collect::<Vec<_>>(),
        [
            (
                0,
                "BackendMismatch",
                "cache built for hip; GPU 0 (NVIDIA H100 80GB HBM3) is cuda"
            ),
            (
                1,
                "BackendMismatch",
                "cache built for hip; GPU 1 (NVIDIA H100 80GB HBM3) is cuda"
            ),
        ]
    );
    let c = entry(&report, "corrupt").unwrap();
    let message = c.message.as_deref().unwrap();
    assert!(
        message.starts_with(&format!("staging {corrupt_pinned}: registry: "))
            && message.to_lowercase().contains("digest"),
        "{message}"
    );
    assert!(
        entry(&report, "unverified").is_none(),
        "an unusable cache is not even considered"
    );
    assert!(
        entry(&report, "elsewhere").is_none(),
        "a cache whose nodeSelector does not select this node is not considered"
    );
    assert_eq!(
        report
            .metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].kind.clone()),
        Some("Node".to_string()),
        "the report is owned by the real Node"
    );

    // On disk: the two caches, Triton group files pointing where pods mount the cache.
    let dir = |name: &str, digest: &str| {
        root.path()
            .join(ns)
            .join(name)
            .join(digest.replace(':', "-"))
    };
    let grp: Value = serde_json::from_slice(
        &std::fs::read(
            dir("triton-vadd", &triton_digest)
                .join("io.triton.cache")
                .join(CUDA_HASH)
                .join("__grp__add_kernel.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let children = grp["child_paths"].as_object().unwrap();
    assert!(!children.is_empty());
    for (child, path) in children {
        assert_eq!(
            path.as_str().unwrap(),
            format!("/var/cache/kubeairunway/kernels/triton-vadd/{CUDA_HASH}/{child}")
        );
    }
    assert!(
        dir("vllm-llama", &vllm_digest)
            .join("io.vllm.cache/torch_compile_cache/edf531ca35/rank_0_0/backbone/cache_key_factors.json")
            .is_file()
    );
    assert!(
        !root.path().join(ns).join("rocm-vadd").exists(),
        "nothing downloaded"
    );
    assert!(
        !root.path().join(ns).join("unverified").exists(),
        "never pulled"
    );
    assert!(
        !root.path().join(ns).join("corrupt").exists(),
        "nothing of a bad layer kept"
    );
    assert!(
        !root
            .path()
            .join(".downloads")
            .read_dir()
            .is_ok_and(|mut d| d.next().is_some())
    );

    // The agent never writes its Node (the controller sets the ready labels).
    let labels = nodes.get(node_name).await.unwrap().metadata.labels.unwrap();
    assert_eq!(
        labels,
        BTreeMap::from([("pool".to_string(), "gpu".to_string())])
    );

    // Exactly two downloads, and the failed attempts; the compatibility decisions counted.
    assert_eq!(running.metrics.downloads("success"), 2);
    assert!(running.metrics.downloads("failure") >= 1);
    let text = running.metrics.encode();
    assert!(
        text.contains(
            "kubeairunway_kernel_cache_compatibility_checks_total{result=\"compatible\"} 3"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "kubeairunway_kernel_cache_compatibility_checks_total{result=\"incompatible\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains("kubeairunway_kernel_cache_size_bytes{namespace=\"ml\",name=\"triton-vadd\",node=\"gpu-node-1\"}"), "{text}");

    // Events on the KernelCaches.
    kubeairunway_sdk::testing::event_where(&client, ns, "triton-vadd", "Staged").await;
    let failed =
        kubeairunway_sdk::testing::event_where(&client, ns, "corrupt", "StagingFailed").await;
    assert!(
        failed[0].contains("on node gpu-node-1: staging "),
        "{failed:?}"
    );
    let incompatible =
        kubeairunway_sdk::testing::event_where(&client, ns, "rocm-vadd", "Incompatible").await;
    assert!(
        incompatible[0].contains("does not fit node gpu-node-1: cache built for hip"),
        "{incompatible:?}"
    );

    // A restarted agent finds the caches complete on disk: Ready again, no download, the
    // transition time kept.
    running.stop().await;
    let restarted = start_agent(&client, node_name, root.path(), &registry, H100X2);
    eventually(60, "the restarted agent to report sizes", || async {
        let text = restarted.metrics.encode();
        (text.contains("name=\"triton-vadd\"") && text.contains("name=\"vllm-llama\""))
            .then_some(())
    })
    .await
    .unwrap();
    let again = node_where(&client, node_name, "still Ready after the restart", |n| {
        state_of(n, "triton-vadd") == Some(CacheState::Ready)
            && state_of(n, "vllm-llama") == Some(CacheState::Ready)
    })
    .await;
    assert_eq!(
        restarted.metrics.downloads("success"),
        0,
        "nothing downloaded again"
    );
    assert_eq!(
        entry(&again, "triton-vadd").unwrap().last_transition_time,
        t.last_transition_time
    );

    // Deleting a KernelCache removes its directory, its label and its entry.
    let api: Api<KernelCache> = Api::namespaced(client.clone(), ns);
    api.delete("triton-vadd", &DeleteParams::default())
        .await
        .unwrap();
    node_where(
        &client,
        node_name,
        "the deleted cache gone from the report",
        |n| {
            entry(n, "triton-vadd").is_none()
                && state_of(n, "vllm-llama") == Some(CacheState::Ready)
        },
    )
    .await;
    eventually(30, "the deleted cache's directory removed", || async {
        (!root.path().join(ns).join("triton-vadd").exists()).then_some(())
    })
    .await
    .unwrap();
    assert!(dir("vllm-llama", &vllm_digest).is_dir());
    restarted.stop().await;
}

#[tokio::test]
async fn a_node_without_gpus_or_node_object_reports_zero_with_a_message_and_downloads_nothing() {
    let (_cluster, client, registry) = setup("kc-agent-nogpu").await;
    let triton = push(&registry, "kc/triton-vadd:v1", &triton_cuda("90").unwrap())
        .await
        .unwrap();
    cache(&client, &registry, "ml", "triton-vadd", &triton, true).await;
    let root = tempfile::tempdir().unwrap();
    // No Node object "cpu-node" exists: the agent reports anyway.
    let running = start_agent(&client, "cpu-node", root.path(), &registry, "[]");
    let report = node_where(
        &client,
        "cpu-node",
        "the cache Incompatible on a node without GPUs",
        |n| state_of(n, "triton-vadd") == Some(CacheState::Incompatible),
    )
    .await;
    let status = report.status.unwrap();
    assert_eq!(status.gpu_count, 0);
    assert_eq!(
        status.gpu_detection.as_deref(),
        Some("no GPUs in the GPU inventory")
    );
    assert_eq!(
        status.caches[0].message.as_deref(),
        Some("no GPUs on this node (no GPUs in the GPU inventory)")
    );
    assert_eq!(running.metrics.downloads("success"), 0);
    assert!(!root.path().join("ml").exists());
    assert!(
        report.metadata.owner_references.is_none(),
        "no Node to own it"
    );
    running.stop().await;
}

#[tokio::test]
async fn caches_of_one_image_share_its_files_and_the_disk_budget_is_kept() {
    use std::os::unix::fs::MetadataExt as _;
    let (_cluster, client, registry) = setup("kc-agent-dedup").await;
    let triton = push(&registry, "kc/triton-vadd:v1", &triton_cuda("90").unwrap())
        .await
        .unwrap();
    let digest = cache(&client, &registry, "ml", "one", &triton, true).await;
    cache(&client, &registry, "ml", "two", &triton, true).await;
    let root = tempfile::tempdir().unwrap();
    let running = start_agent(&client, "dedup-node", root.path(), &registry, H100X2);
    node_where(&client, "dedup-node", "both Ready", |n| {
        state_of(n, "one") == Some(CacheState::Ready)
            && state_of(n, "two") == Some(CacheState::Ready)
    })
    .await;
    assert_eq!(
        running.metrics.downloads("success"),
        1,
        "one download for both"
    );
    let dir = |name: &str| {
        root.path()
            .join("ml")
            .join(name)
            .join(digest.replace(':', "-"))
    };
    let kernel = format!("io.triton.cache/{CUDA_HASH}/add_kernel.json");
    let ino = |p: std::path::PathBuf| std::fs::metadata(p).unwrap().ino();
    assert_eq!(ino(dir("one").join(&kernel)), ino(dir("two").join(&kernel)));
    // Each cache's group file points at its own mount path.
    let group = |name: &str| {
        std::fs::read_to_string(dir(name).join(format!(
            "io.triton.cache/{CUDA_HASH}/__grp__add_kernel.json"
        )))
        .unwrap()
    };
    assert!(group("one").contains("/kernels/one/"), "{}", group("one"));
    assert!(group("two").contains("/kernels/two/"), "{}", group("two"));
    running.stop().await;

    // A node whose budget the cache does not fit: Failed, with the numbers.
    let small = tempfile::tempdir().unwrap();
    let running = start_agent_with(
        &client,
        "small-node",
        small.path(),
        &registry,
        H100X2,
        |s| {
            s.disk_budget = Some(Size::Bytes(100));
        },
    );
    // Once no stage is under way (a stage reserves its bytes while it runs, and the other
    // caches of this node are tried too), nothing is used.
    let report = node_where(
        &client,
        "small-node",
        "over budget, no stage under way",
        |n| {
            state_of(n, "one") == Some(CacheState::Failed)
                && n.status
                    .as_ref()
                    .and_then(|s| s.disk.as_ref())
                    .is_some_and(|d| d.used_bytes == 0)
        },
    )
    .await;
    let message = entry(&report, "one").unwrap().message.clone().unwrap();
    assert!(
        message.contains("over the node's disk budget of 100 bytes"),
        "{message}"
    );
    assert!(!small.path().join("ml").exists());
    // The node's status says what the caches may take and take.
    let disk = report.status.clone().unwrap().disk.unwrap();
    assert_eq!((disk.budget_bytes, disk.used_bytes), (Some(100), 0));
    running.stop().await;

    // A node that must keep all of its filesystem free (a floor of 100%): no stage fits,
    // whatever the budget, and nothing is written.
    let full = tempfile::tempdir().unwrap();
    let running = start_agent_with(&client, "full-node", full.path(), &registry, H100X2, |s| {
        s.min_free = Size::Percent(100);
    });
    let report = node_where(&client, "full-node", "under the floor", |n| {
        state_of(n, "one") == Some(CacheState::Failed)
    })
    .await;
    let message = entry(&report, "one").unwrap().message.clone().unwrap();
    assert!(
        message.contains("bytes free on") && message.contains("(--min-free)"),
        "{message}"
    );
    assert!(!full.path().join("ml").exists());
    let disk = report.status.clone().unwrap().disk.unwrap();
    assert!(
        disk.budget_bytes.is_none() && disk.min_free_bytes > 0,
        "{disk:?}"
    );
    running.stop().await;
}

/// The controller reads pull credentials from real Secrets (then hands them over to the
/// agents): the first pull Secret naming the registry wins, a missing Secret is skipped (as the kubelet does), another registry gets none,
/// and a Secret without a docker config is an error that names it.
#[tokio::test]
async fn pull_credentials_come_from_real_secrets() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::PostParams;
    use kubeairunway_kernelcache_artifact::secrets::{KubeSecrets, auth_for};
    use oci_client::secrets::RegistryAuth;

    let cluster = kubeairunway_testcluster::shared();
    let client = cluster.client().await.unwrap();
    let ns = cluster.namespace("kc-pull");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let config = r#"{"auths":{"reg.example:5000":{"username":"u","password":"p"}}}"#;
    for (name, body) in [
        (
            "pull",
            json!({"type": "kubernetes.io/dockerconfigjson", "stringData": {".dockerconfigjson": config}}),
        ),
        (
            "opaque",
            json!({"type": "Opaque", "stringData": {"token": "x"}}),
        ),
    ] {
        let mut secret = body;
        secret["metadata"] = json!({"name": name});
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(secret).unwrap(),
            )
            .await
            .unwrap();
    }
    // Read as the chart's controller account, under the Role the chart renders for the
    // pull Secrets it is told about (only that Role: the shared cluster's other tests
    // render the chart too).
    let Some(helm_bin) = kubeairunway_e2e::helm::require() else {
        return;
    };
    let objects = kubeairunway_e2e::helm::template(
        &helm_bin,
        &kubeairunway_e2e::helm::chart("kernelcache-provider"),
        &[
            ("controller.pullSecrets[0].namespace", &ns),
            ("controller.pullSecrets[0].names[0]", "missing"),
            ("controller.pullSecrets[0].names[1]", "pull"),
            ("controller.pullSecrets[0].names[2]", "opaque"),
        ],
    )
    .unwrap();
    let pull_role: Vec<Value> = objects
        .into_iter()
        .filter(|o| o["metadata"]["namespace"] == ns.as_str())
        .collect();
    let identity = kubeairunway_e2e::rbac::ChartIdentity::apply(
        cluster,
        &client,
        &pull_role,
        "the kernel-cache controller",
        "kubeairunway-system",
        "release-kernelcache-provider-controller",
    )
    .await
    .unwrap();
    let reader = KubeSecrets(identity.client(cluster).await.unwrap());
    let names = ["missing".to_string(), "pull".to_string()];
    let auth = auth_for(&reader, &ns, &names, "reg.example:5000/c@sha256:ab")
        .await
        .unwrap();
    assert_eq!(auth, RegistryAuth::Basic("u".into(), "p".into()));
    let other = auth_for(&reader, &ns, &names, "other.example/c@sha256:ab")
        .await
        .unwrap();
    assert_eq!(other, RegistryAuth::Anonymous);
    let e = auth_for(
        &reader,
        &ns,
        &["opaque".to_string()],
        "reg.example:5000/c@sha256:ab",
    )
    .await
    .unwrap_err();
    assert_eq!(
        e,
        "pull secret opaque has no .dockerconfigjson or .dockercfg key"
    );
}

/// The agent and the controller share flags (registries, credentials): each flag has one
/// environment variable in both binaries, and the docs name every one.
#[test]
fn every_flag_has_one_environment_variable_shared_with_the_controller_and_named_in_the_docs() {
    use clap::CommandFactory;
    let readme = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/kernelcache.md"),
    )
    .unwrap()
    .replace('\n', " ");
    // long flag -> (environment variable, value delimiter), across both binaries.
    let mut seen: std::collections::BTreeMap<String, (String, Option<char>)> =
        std::collections::BTreeMap::new();
    for cmd in [
        kubeairunway_kernelcache_agent::app::Cli::command(),
        kubeairunway_kernelcache_controller::app::Cli::command(),
    ] {
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if ["help", "version"].contains(&long) {
                continue;
            }
            let env = arg
                .get_env()
                .and_then(|e| e.to_str())
                .unwrap_or_else(|| {
                    panic!("{} --{long} has no environment variable", cmd.get_name())
                })
                .to_string();
            let named = format!("`--{long}` (`{env}`");
            assert!(
                readme.contains(&named),
                "docs/kernelcache.md does not name {named})"
            );
            let this = (env, arg.get_value_delimiter());
            if let Some(other) = seen.insert(long.to_string(), this.clone()) {
                assert_eq!(other, this, "--{long} differs between the binaries");
            }
        }
    }
    assert_eq!(
        seen["plain-http-registry"],
        ("PLAIN_HTTP_REGISTRIES".to_string(), Some(','))
    );
}

/// Every agent runs as one service account, so RBAC cannot keep one from writing another
/// node's report (which the controller turns into Node labels). The chart's agent-node
/// policy binds each to its node by the node in its bound token: the agent on node-a
/// writes node-a's KernelCacheNode and is refused node-b's (by name, by spec.nodeName, its
/// status); the same service account by client certificate, no node, is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_writes_only_its_own_nodes_report() {
    let (cluster, client) = kubeairunway_sdk::testing::private_cluster(
        "agent-node",
        &kubeairunway_kernelcache_api::crds(),
    )
    .await
    .unwrap();
    let Some(identity) = chart_identity(&cluster, &client, "agent").await else {
        return;
    };
    let mut on = Vec::new();
    for node in ["node-a", "node-b"] {
        Api::<Node>::all(client.clone())
            .patch(
                node,
                &PatchParams::apply("test"),
                &Patch::Apply(
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
                ),
            )
            .await
            .unwrap();
        let agent = identity
            .client_on_node(&cluster, &client, node)
            .await
            .unwrap();
        on.push(Api::<KernelCacheNode>::all(agent));
    }
    let pp = PatchParams::apply("kernelcache-agent").force();
    on[0]
        .patch("node-a", &pp, &Patch::Apply(report("node-a", "node-a")))
        .await
        .unwrap();
    on[1]
        .patch("node-b", &pp, &Patch::Apply(report("node-b", "node-b")))
        .await
        .unwrap();
    let status = Patch::Merge(json!({"status": {"gpuCount": 8}}));
    on[0]
        .patch_status("node-a", &PatchParams::default(), &status)
        .await
        .unwrap();
    let elsewhere = "the kernel-cache agent on node-a writes only the KernelCacheNode node-a (name and spec.nodeName)";
    for (name, node) in [
        ("node-b", "node-b"),
        ("node-b", "node-a"),
        ("node-a", "node-b"),
    ] {
        kubeairunway_e2e::policy::assert_denied(
            &on[0]
                .patch(name, &pp, &Patch::Apply(report(name, node)))
                .await,
            AGENT_NODE_POLICY,
            elsewhere,
        );
    }
    kubeairunway_e2e::policy::assert_denied(
        &on[0]
            .patch_status("node-b", &PatchParams::default(), &status)
            .await,
        AGENT_NODE_POLICY,
        elsewhere,
    );
    let by_certificate: Api<KernelCacheNode> = Api::all(identity.client(&cluster).await.unwrap());
    kubeairunway_e2e::policy::assert_denied(
        &by_certificate
            .patch("node-a", &pp, &Patch::Apply(report("node-a", "node-a")))
            .await,
        AGENT_NODE_POLICY,
        "the kernel-cache agent writes KernelCacheNodes only with a service-account token bound to its node (authentication.kubernetes.io/node-name)",
    );
    // node-b's report is as node-b wrote it.
    let b = Api::<KernelCacheNode>::all(client.clone())
        .get("node-b")
        .await
        .unwrap();
    assert_eq!(b.spec.node_name, "node-b");
    assert!(b.status.is_none_or(|s| s.gpu_count == 0));
}

const MI210: &str = "- {name: AMD Instinct MI210, backend: hip, arch: gfx90a, warpSize: 64}";

/// Record `in_use` in the node's report as the controller does (`spec.inUse`).
async fn record_in_use(client: &Client, node: &str, in_use: &[String]) {
    let api: Api<KernelCacheNode> = Api::all(client.clone());
    let body = json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCacheNode",
                      "metadata": {"name": node}, "spec": {"inUse": in_use}});
    api.patch(
        node,
        &PatchParams::apply("kernelcache-controller").force(),
        &Patch::Apply(&body),
    )
    .await
    .unwrap();
}

/// A budget that fits one of two caches: with the staged one in use by no pod of the node
/// (the controller's record in the node's report), it is evicted for the other, reported
/// `Evicted`/`EvictedForSpace`, and staged again once it fits without evicting; in use,
/// it stays and the other does not fit.
#[tokio::test]
async fn a_cache_no_pod_uses_is_evicted_for_one_that_does_not_fit_and_one_in_use_is_kept() {
    let (_cluster, client, registry) = setup("kc-agent-evict").await;
    // Two caches of different content, `a` the larger, each declaring a size below what
    // it takes on disk (the real example's label declares the original cache's).
    let declaring = |extra: &[(&str, &[u8])], declared: u64| {
        let image = triton_rocm(extra).unwrap();
        let mut config: Value = serde_json::from_slice(&image.config).unwrap();
        config["config"]["Labels"]["cache.triton.image/cache-size-bytes"] =
            json!(declared.to_string());
        CacheImage {
            config: serde_json::to_vec(&config).unwrap(),
            ..image
        }
    };
    let a_image = declaring(&[("io.triton.cache/extra-a.bin", &[1u8; 8000])], 8000);
    let b_image = declaring(&[("io.triton.cache/extra-b.bin", &[2u8; 4000])], 4000);
    let a = push(&registry, "kc/evict-a:v1", &a_image).await.unwrap();
    let b = push(&registry, "kc/evict-b:v1", &b_image).await.unwrap();
    let a_digest = cache(&client, &registry, "ml", "a", &a, true).await;
    // `b` is not usable yet: no node wants it.
    cache(&client, &registry, "ml", "b", &b, false).await;
    let size_of = |n: &KernelCacheNode, name: &str| {
        entry(n, name)
            .and_then(|c| c.size_bytes)
            .map(|b| u64::try_from(b).unwrap())
    };

    // The size of `a` on disk, measured on a node without a budget.
    let measure = tempfile::tempdir().unwrap();
    let running = start_agent(&client, "measure-node", measure.path(), &registry, MI210);
    let report = node_where(&client, "measure-node", "a Ready", |n| {
        state_of(n, "a") == Some(CacheState::Ready)
    })
    .await;
    let a_size = size_of(&report, "a").unwrap();
    running.stop().await;

    let root = tempfile::tempdir().unwrap();
    let node = "evict-node";
    let running = start_agent_with(&client, node, root.path(), &registry, MI210, |s| {
        s.disk_budget = Some(Size::Bytes(a_size));
    });
    node_where(&client, node, "a Ready", |n| {
        state_of(n, "a") == Some(CacheState::Ready)
    })
    .await;
    // No pod on the node uses a cache; then `b` is wanted.
    record_in_use(&client, node, &[]).await;
    let b_digest = cache(&client, &registry, "ml", "b", &b, true).await;
    let report = node_where(&client, node, "a Evicted, b Ready", |n| {
        state_of(n, "a") == Some(CacheState::Evicted) && state_of(n, "b") == Some(CacheState::Ready)
    })
    .await;
    let evicted = entry(&report, "a").unwrap();
    assert_eq!(evicted.reason.as_deref(), Some("EvictedForSpace"));
    let message = evicted.message.as_deref().unwrap();
    assert!(message.contains(&format!("ml/b@{b_digest}")), "{message}");
    assert!(evicted.size_bytes.is_none());
    let dir = |name: &str, digest: &str| {
        root.path()
            .join("ml")
            .join(name)
            .join(digest.replace(':', "-"))
    };
    assert!(!dir("a", &a_digest).exists(), "a's directory removed");
    assert!(dir("b", &b_digest).exists());
    let disk = report.status.clone().unwrap().disk.unwrap();
    assert_eq!(
        u64::try_from(disk.used_bytes).unwrap(),
        size_of(&report, "b").unwrap(),
        "only b is on disk"
    );
    // The controller sets no ready label for `a` here (labels::ready_labels of this report).
    assert_eq!(
        running.metrics.downloads("success"),
        2,
        "a is not staged again by evicting b"
    );

    // After a restart the agent still knows `a` was evicted (from its report): once it
    // has decided on both caches again (each counted as compatible), `a` is still
    // Evicted and `b` still on disk, nothing downloaded.
    running.stop().await;
    let running = start_agent_with(&client, node, root.path(), &registry, MI210, |s| {
        s.disk_budget = Some(Size::Bytes(a_size));
    });
    eventually(90, "both caches decided again", || async {
        let text = running.metrics.encode();
        let compatible = text
            .lines()
            .find(|l| {
                l.starts_with("kubeairunway_kernel_cache_compatibility_checks_total")
                    && l.contains("compatible")
                    && !l.contains("incompatible")
            })?
            .rsplit(' ')
            .next()?
            .parse::<f64>()
            .ok()?;
        (compatible >= 2.0).then_some(())
    })
    .await
    .unwrap();
    let report = node_where(&client, node, "a still Evicted", |n| {
        state_of(n, "a") == Some(CacheState::Evicted) && state_of(n, "b") == Some(CacheState::Ready)
    })
    .await;
    assert!(dir("b", &b_digest).exists(), "b not evicted in turn");
    assert_eq!(running.metrics.downloads("success"), 0);
    assert_eq!(
        entry(&report, "a").unwrap().reason.as_deref(),
        Some("EvictedForSpace")
    );

    // `b` no longer wanted: `a` fits again without evicting and is staged again.
    cache(&client, &registry, "ml", "b", &b, false).await;
    node_where(&client, node, "a Ready again, b gone", |n| {
        state_of(n, "a") == Some(CacheState::Ready) && state_of(n, "b").is_none()
    })
    .await;
    assert!(!root.path().join("ml").join("b").exists());

    // A pod on the node uses `a`: `b` wanted again does not fit, and `a` stays.
    record_in_use(&client, node, &[format!("ml/a@{a_digest}")]).await;
    cache(&client, &registry, "ml", "b", &b, true).await;
    let report = node_where(&client, node, "b over the budget", |n| {
        state_of(n, "b") == Some(CacheState::Failed)
    })
    .await;
    assert_eq!(state_of(&report, "a"), Some(CacheState::Ready));
    let message = entry(&report, "b").unwrap().message.clone().unwrap();
    assert!(
        message.contains(&format!("over the node's disk budget of {a_size} bytes")),
        "{message}"
    );
    assert!(dir("a", &a_digest).exists(), "a kept");
    running.stop().await;
}
