//! Model caches on the nodes: the node agent (in-process, one per fake node, each as the
//! chart's agent service account when helm is there) against a real API server of its
//! own and the loopback stand-in of the Hugging Face hub (`kubeairunway-modelcache-hub`'s
//! `testing` feature). The agent tests play the controller where the agent needs it (the
//! handed-over hub token); the last test runs the controller too (status, node labels,
//! the token handed over from the user's Secret).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kubeairunway_e2e::eventually;
use kubeairunway_kernelcache_agent::gpu::Static;
use kubeairunway_kernelcache_agent::metrics::Metrics;
use kubeairunway_kernelcache_agent::models::ModelSettings;
use kubeairunway_kernelcache_agent::node::KubeNode;
use kubeairunway_kernelcache_agent::{self as agent, Seams, Settings};
use kubeairunway_kernelcache_api::KernelCacheNode;
use kubeairunway_kernelcache_api::model::{
    ModelCache, ModelCacheState, ModelCacheStatus, NodeModelCache, reasons,
};
use kubeairunway_kernelcache_api::names::model_token_secret;
use kubeairunway_kernelcache_artifact::secrets;
use kubeairunway_modelcache_hub::testing::{Content, StandIn, StandInFile, commit_id};
use kubeairunway_testcluster::TestCluster;
use serde_json::json;

/// The chart's handover namespace (values.yaml `credentials.namespace`).
const CREDENTIALS_NS: &str = "kernelcache-credentials";
pub(crate) const NS: &str = "ml";
/// The chart's model-cache root (values.yaml `agent.modelCaches.root`), which the
/// controller's volumes point below (the agents here each have a temporary root: the
/// volumes are objects only, no kubelet mounts them).
pub(crate) const MODEL_ROOT: &str = "/var/lib/kubeairunway/model-caches";
const BIG: &str = "model.safetensors";
const BIG_LEN: u64 = 6 << 20;

pub(crate) fn files() -> Vec<StandInFile> {
    vec![
        StandInFile::regular("config.json", b"{\"model_type\": \"tiny\"}\n"),
        StandInFile::new(
            BIG,
            Content::Pattern {
                len: BIG_LEN,
                seed: 7,
            },
            true,
        ),
        StandInFile::regular("tokenizer/tokenizer.json", b"{}\n"),
    ]
}

pub(crate) struct RunningAgent {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    metrics: Arc<Metrics>,
}

impl RunningAgent {
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

pub(crate) fn start_agent(
    client: &Client,
    node_name: &str,
    root: &Path,
    hub: &StandIn,
) -> RunningAgent {
    start_agent_with(client, node_name, root, hub, |_| {})
}

pub(crate) fn start_agent_with(
    client: &Client,
    node_name: &str,
    root: &Path,
    hub: &StandIn,
    tweak: impl FnOnce(&mut ModelSettings),
) -> RunningAgent {
    // The test machine's disk may be fuller than the default floors (a share of the whole
    // filesystem) allow; the floor's own test sets it.
    let floor = kubeairunway_kernelcache_agent::space::Size::Bytes(1 << 20);
    let mut settings = Settings::new(node_name, root.join("kernels"));
    settings.min_free = floor;
    settings.resync = Duration::from_secs(2);
    settings.credentials_namespace = Some(CREDENTIALS_NS.into());
    settings.models = Some(ModelSettings {
        hf_endpoint: hub.url.clone(),
        progress_every: Duration::from_millis(300),
        resync: Duration::from_secs(2),
        min_free: floor,
        ..ModelSettings::new(root.join("models"))
    });
    if let Some(m) = settings.models.as_mut() {
        tweak(m);
    }
    let seams = Seams {
        gpus: Arc::new(Static::parse("[]").unwrap()),
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

/// The kernel-cache chart's RBAC applied, and its agent's identity (`None` without helm
/// outside CI: the agents then run as the admin).
async fn agent_identity(
    cluster: &TestCluster,
    admin: &Client,
) -> Option<kubeairunway_e2e::rbac::ChartIdentity> {
    use kubeairunway_e2e::helm;
    let helm_bin = helm::require()?;
    let objects = helm::template(&helm_bin, &helm::chart("kernelcache-provider"), &[]).unwrap();
    let workload = objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("the chart runs the agent");
    let spec = &workload["spec"]["template"]["spec"];
    let args = spec["containers"][0]["args"].to_string();
    assert!(
        args.contains("--model-cache-root="),
        "model caches are on by default: {args}"
    );
    let identity = kubeairunway_e2e::rbac::ChartIdentity::apply(
        cluster,
        admin,
        &objects,
        "the kernel-cache agent",
        workload["metadata"]["namespace"].as_str().unwrap(),
        spec["serviceAccountName"].as_str().unwrap(),
    )
    .await
    .unwrap();
    crate::kernelcache_agent::enforce_agent_policies(cluster, admin, &objects, &identity).await;
    Some(identity)
}

pub(crate) async fn setup(tag: &str) -> (TestCluster, Client) {
    let (cluster, client) =
        kubeairunway_sdk::testing::private_cluster(tag, &kubeairunway_kernelcache_api::crds())
            .await
            .unwrap();
    cluster.ensure_namespace(NS);
    cluster.ensure_namespace(CREDENTIALS_NS);
    (cluster, client)
}

pub(crate) async fn node(client: &Client, name: &str, pool: &str) {
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"pool": pool}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
}

pub(crate) async fn model_cache(
    client: &Client,
    name: &str,
    spec: serde_json::Value,
) -> kube::Result<ModelCache> {
    Api::<ModelCache>::namespaced(client.clone(), NS)
        .patch(
            name,
            &PatchParams::apply("user"),
            &Patch::Apply(json!({
                "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "ModelCache",
                "metadata": {"name": name, "namespace": NS},
                "spec": spec,
            })),
        )
        .await
}

/// Hands `token` over for the ModelCache `name` to the agents of `nodes`, as the
/// controller does: sealed to the key each agent published, in each node's Secret.
async fn hand_over(client: &Client, name: &str, token: &str, nodes: &[&str]) {
    use base64::Engine as _;
    use kubeairunway_kernelcache_artifact::sealed::{node_secret_name, seal};
    let data: secrets::SecretData = [(
        "token".to_string(),
        k8s_openapi::ByteString(token.as_bytes().to_vec()),
    )]
    .into();
    for node in nodes {
        let report = node_where(client, node, "the agent's published key", |n| {
            n.spec.credentials_key.is_some()
        })
        .await;
        let sealed = seal(report.spec.credentials_key.as_deref().unwrap(), &data).unwrap();
        let secret = node_secret_name(node);
        Api::<Secret>::namespaced(client.clone(), CREDENTIALS_NS)
            .patch(
                &secret,
                &PatchParams::apply(&format!("test-{name}")).force(),
                &Patch::Apply(json!({
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": secret, "namespace": CREDENTIALS_NS},
                    "data": {model_token_secret(NS, name):
                        base64::engine::general_purpose::STANDARD.encode(sealed)},
                })),
            )
            .await
            .unwrap();
    }
}

fn entry<'a>(node: &'a KernelCacheNode, name: &str) -> Option<&'a NodeModelCache> {
    node.status
        .as_ref()?
        .model_caches
        .iter()
        .find(|c| c.name == name)
}

async fn node_where(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&KernelCacheNode) -> bool,
) -> KernelCacheNode {
    let api: Api<KernelCacheNode> = Api::all(client.clone());
    let found = eventually(90, what, || async {
        api.get_opt(name).await.ok().flatten().filter(|n| check(n))
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
            panic!("{e}; last status of {name}: {last:#?}")
        }
    }
}

fn state(node: &KernelCacheNode, name: &str) -> Option<(ModelCacheState, Option<String>)> {
    entry(node, name).map(|e| (e.state, e.reason.clone()))
}

/// The snapshot of `commit` under a node's model-cache root holds `files`, each through a
/// link into `blobs/`, and `refs/main` names the commit.
fn assert_cached(root: &Path, repo_folder: &str, commit: &str, files: &[StandInFile]) {
    let repo = root.join("models/hub").join(repo_folder);
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        commit
    );
    for f in files {
        let link = repo.join("snapshots").join(commit).join(&f.path);
        let target =
            std::fs::read_link(&link).unwrap_or_else(|e| panic!("{}: {e}", link.display()));
        assert!(
            target.ends_with(format!("blobs/{}", f.etag)),
            "{}",
            target.display()
        );
        let content = std::fs::read(&link).unwrap();
        assert_eq!(
            kubeairunway_modelcache_hub::hash::sha256(&content),
            f.sha256,
            "{}",
            f.path
        );
    }
}

#[tokio::test]
async fn model_caches_go_ready_on_selected_nodes_with_clear_reasons_for_token_and_budget() {
    let (cluster, client) = setup("mc-agent").await;
    let hub = StandIn::start().await;
    let commit = commit_id("tiny-1");
    hub.commit("acme/tiny", "main", &commit, files());
    let gated_commit = commit_id("gated-1");
    hub.commit("acme/gated", "main", &gated_commit, files());
    // As the hub does: a gated model's files are listed to anyone, downloaded with access.
    hub.gate_files("acme/gated", "hf_right");
    for (name, pool) in [("gpu-a", "a"), ("gpu-b", "a"), ("cpu-c", "c")] {
        node(&client, name, pool).await;
    }
    let selector = json!({"pool": "a"});
    model_cache(
        &client,
        "tiny",
        json!({"source": "hf://acme/tiny", "nodeSelector": selector}),
    )
    .await
    .unwrap();
    model_cache(
        &client,
        "gated",
        json!({"source": "hf://acme/gated", "nodeSelector": selector,
               "credentialsSecretRef": {"name": "hf-token"}}),
    )
    .await
    .unwrap();
    model_cache(
        &client,
        "small",
        json!({"source": "hf://acme/tiny", "nodeSelector": selector, "storageBudget": "1Mi"}),
    )
    .await
    .unwrap();

    // Each agent with a token bound to its node (the chart's agent-node policy).
    let identity = agent_identity(&cluster, &client).await;
    let roots: BTreeMap<&str, tempfile::TempDir> = ["gpu-a", "gpu-b", "cpu-c"]
        .into_iter()
        .map(|n| (n, tempfile::tempdir().unwrap()))
        .collect();
    let mut agents: Vec<RunningAgent> = Vec::new();
    for (n, root) in &roots {
        let agent_client = match &identity {
            Some(id) => id.client_on_node(&cluster, &client, n).await.unwrap(),
            None => client.clone(),
        };
        agents.push(start_agent(&agent_client, n, root.path(), &hub));
    }
    hand_over(&client, "gated", "hf_wrong", &["gpu-a", "gpu-b"]).await;

    let total: u64 = files().iter().map(|f| f.content.len()).sum();
    for name in ["gpu-a", "gpu-b"] {
        let report = node_where(
            &client,
            name,
            "tiny Ready, gated refused, small over budget",
            |n| {
                state(n, "tiny").is_some_and(|s| s.0 == ModelCacheState::Ready)
                    && entry(n, "gated")
                        .is_some_and(|g| g.reason.as_deref() == Some(reasons::GATED))
                    && state(n, "small").is_some_and(|s| s.0 == ModelCacheState::Failed)
            },
        )
        .await;
        let tiny = entry(&report, "tiny").unwrap();
        assert_eq!(tiny.commit.as_deref(), Some(commit.as_str()));
        assert_eq!(tiny.reason.as_deref(), Some(reasons::READY));
        assert_eq!(tiny.bytes_total, Some(i64::try_from(total).unwrap()));
        assert_eq!(tiny.bytes_done, tiny.bytes_total);
        assert_eq!(tiny.observed_generation, Some(1));
        let gated = entry(&report, "gated").unwrap();
        assert_eq!(gated.reason.as_deref(), Some(reasons::GATED), "{gated:?}");
        assert!(
            gated.message.as_deref().unwrap().contains("acme/gated"),
            "{gated:?}"
        );
        let small = entry(&report, "small").unwrap();
        assert_eq!(
            small.reason.as_deref(),
            Some(reasons::OVER_BUDGET),
            "{small:?}"
        );
        assert_eq!(small.commit.as_deref(), Some(commit.as_str()));
        assert_cached(roots[name].path(), "models--acme--tiny", &commit, &files());
        assert!(
            !roots[name]
                .path()
                .join("models/hub/models--acme--gated/snapshots")
                .exists(),
            "nothing of the gated repository is published"
        );
    }
    // Events on the caches, from the nodes.
    kubeairunway_sdk::testing::event_where(&client, NS, "tiny", "Downloaded").await;
    kubeairunway_sdk::testing::event_where(&client, NS, "gated", "DownloadFailed").await;
    kubeairunway_sdk::testing::event_where(&client, NS, "small", "DownloadFailed").await;
    // The kernel-cache loop's fields are its own: both loops write the same object.
    let a = node_where(&client, "gpu-a", "the kernel-cache report", |n| {
        n.status.as_ref().is_some_and(|s| s.last_updated.is_some())
    })
    .await;
    let managers: Vec<&str> = a
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.as_deref())
        .collect();
    assert!(managers.contains(&"modelcache-agent"), "{managers:?}");
    assert!(managers.contains(&"kernelcache-agent"), "{managers:?}");

    // The node the selector leaves out: its model-cache loop has reported (the caches
    // existed before it started), and it holds nothing.
    let c = node_where(&client, "cpu-c", "cpu-c's model-cache report", |n| {
        n.metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|m| m.manager.as_deref() == Some("modelcache-agent"))
    })
    .await;
    assert!(
        c.status.as_ref().unwrap().model_caches.is_empty(),
        "{:?}",
        c.status
    );
    assert!(
        !roots["cpu-c"]
            .path()
            .join("models/hub/models--acme--tiny")
            .exists()
    );

    // The right token: the gated model downloads at its retry.
    hand_over(&client, "gated", "hf_right", &["gpu-a", "gpu-b"]).await;
    let report = node_where(&client, "gpu-a", "gated Ready with the right token", |n| {
        state(n, "gated").is_some_and(|s| s.0 == ModelCacheState::Ready)
    })
    .await;
    assert_eq!(
        entry(&report, "gated").unwrap().commit.as_deref(),
        Some(gated_commit.as_str())
    );
    assert_cached(
        roots["gpu-a"].path(),
        "models--acme--gated",
        &gated_commit,
        &files(),
    );
    // Another cache of the gated model without a token: the files on the node are no
    // pass, the hub refuses this cache's file request.
    model_cache(
        &client,
        "gated-copy",
        json!({"source": "hf://acme/gated", "nodeSelector": selector}),
    )
    .await
    .unwrap();
    let report = node_where(&client, "gpu-a", "gated-copy refused", |n| {
        state(n, "gated-copy").is_some_and(|s| s.0 == ModelCacheState::Failed)
    })
    .await;
    let copy = entry(&report, "gated-copy").unwrap();
    assert_eq!(copy.reason.as_deref(), Some(reasons::GATED), "{copy:?}");
    Api::<ModelCache>::namespaced(client.clone(), NS)
        .delete("gated-copy", &kube::api::DeleteParams::default())
        .await
        .unwrap();

    // Deleted: the entry leaves the report.
    Api::<ModelCache>::namespaced(client.clone(), NS)
        .delete("small", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    node_where(&client, "gpu-a", "small gone from the report", |n| {
        entry(n, "small").is_none() && entry(n, "tiny").is_some()
    })
    .await;
    // The only cache of its repository deleted (no controller runs here, so no
    // finalizer): its folder leaves the node; the other repository's files stay.
    Api::<ModelCache>::namespaced(client.clone(), NS)
        .delete("gated", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let gated_folder = roots["gpu-a"].path().join("models/hub/models--acme--gated");
    eventually(60, "the deleted cache's folder removed", || async {
        (!gated_folder.exists()).then_some(())
    })
    .await
    .unwrap();
    assert_cached(
        roots["gpu-a"].path(),
        "models--acme--tiny",
        &commit,
        &files(),
    );
    for a in agents {
        a.stop().await;
    }
}

#[tokio::test]
async fn a_download_interrupted_by_an_agent_restart_resumes_where_it_stopped() {
    let (_cluster, client) = setup("mc-resume").await;
    let hub = StandIn::start().await;
    let commit = commit_id("tiny-1");
    hub.commit("acme/tiny", "main", &commit, files());
    // The big file stalls after 4 MiB (at least 3 MiB reach the disk: writes are
    // buffered by 1 MiB), the connection kept open.
    hub.stall_after(BIG, 4 << 20);
    node(&client, "gpu-a", "a").await;
    model_cache(&client, "tiny", json!({"source": "hf://acme/tiny"}))
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let first = start_agent(&client, "gpu-a", root.path(), &hub);
    let report = node_where(&client, "gpu-a", "tiny downloading with progress", |n| {
        entry(n, "tiny").is_some_and(|e| {
            e.state == ModelCacheState::Downloading && e.bytes_done.is_some_and(|b| b > 0)
        })
    })
    .await;
    let during = entry(&report, "tiny").unwrap();
    assert_eq!(during.commit.as_deref(), Some(commit.as_str()));
    assert!(during.bytes_done < during.bytes_total, "{during:?}");
    first.stop().await;
    assert!(
        !root
            .path()
            .join("models/hub/models--acme--tiny/snapshots")
            .exists(),
        "nothing is published before the download completes"
    );

    let second = start_agent(&client, "gpu-a", root.path(), &hub);
    node_where(&client, "gpu-a", "tiny Ready after the restart", |n| {
        entry(n, "tiny").is_some_and(|e| e.state == ModelCacheState::Ready)
    })
    .await;
    assert_cached(root.path(), "models--acme--tiny", &commit, &files());
    let resumed: Vec<_> = hub
        .log()
        .into_iter()
        .filter(|l| l.method == "GET" && l.path.ends_with(BIG))
        .collect();
    assert!(
        resumed
            .iter()
            .any(|l| l.status == 206 && l.range_from.is_some_and(|r| r > 0)),
        "the restarted agent resumed with Range: {resumed:?}"
    );
    assert!(hub.sent(BIG) < 2 * BIG_LEN, "sent {}", hub.sent(BIG));
    second.stop().await;
}

/// A cache at `main` follows a new upstream commit without a spec change: the agent
/// resolves the revision again (`refresh_every`, here 1 s), downloads the new commit next
/// to the one in use, and reports it Ready; the entry never leaves `Ready` meanwhile (a
/// watch sees every change), and the old snapshot goes only once the new one is complete.
#[tokio::test]
async fn a_moving_revision_is_followed_and_the_old_commit_stays_until_the_new_one_is_complete() {
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher};
    let (_cluster, client) = setup("mc-refresh").await;
    let hub = StandIn::start().await;
    let (c1, c2) = (commit_id("tiny-1"), commit_id("tiny-2"));
    hub.commit("acme/tiny", "main", &c1, files());
    node(&client, "gpu-a", "a").await;
    model_cache(&client, "tiny", json!({"source": "hf://acme/tiny"}))
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let agent = start_agent_with(&client, "gpu-a", root.path(), &hub, |m| {
        m.refresh_every = Some(Duration::from_secs(1));
    });
    node_where(&client, "gpu-a", "tiny Ready at the first commit", |n| {
        entry(n, "tiny").is_some_and(|e| {
            e.state == ModelCacheState::Ready && e.commit.as_deref() == Some(c1.as_str())
        })
    })
    .await;
    // From now on, every state the report goes through.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let watching = {
        let seen = Arc::clone(&seen);
        let api: Api<KernelCacheNode> = Api::all(client.clone());
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Some(Ok(n)) = events.next().await {
                if let Some(e) = entry(&n, "tiny") {
                    seen.lock()
                        .unwrap()
                        .push((e.state, e.reason.clone(), e.commit.clone()));
                }
            }
        })
    };
    // Upstream moves main to a new commit: a changed config and a new file.
    let mut moved = files();
    moved[0] = StandInFile::regular("config.json", b"{\"model_type\": \"tiny\", \"v\": 2}\n");
    moved.push(StandInFile::regular("generation_config.json", b"{}\n"));
    hub.commit("acme/tiny", "main", &c2, moved.clone());
    node_where(&client, "gpu-a", "tiny Ready at the new commit", |n| {
        entry(n, "tiny").is_some_and(|e| {
            e.state == ModelCacheState::Ready && e.commit.as_deref() == Some(c2.as_str())
        })
    })
    .await;
    assert_cached(root.path(), "models--acme--tiny", &c2, &moved);
    // The old snapshot goes once the new one is complete.
    let old = root
        .path()
        .join("models/hub/models--acme--tiny/snapshots")
        .join(&c1);
    eventually(30, "the old snapshot removed", || async {
        (!old.exists()).then_some(())
    })
    .await
    .unwrap();
    watching.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .all(|(state, _, _)| *state == ModelCacheState::Ready),
        "the entry stayed Ready throughout: {seen:?}"
    );
    agent.stop().await;
}

/// An agent started before its Node exists: caches with a nodeSelector wait for its
/// labels and download once the Node appears, without waiting for a resync (here an hour).
#[tokio::test]
async fn caches_with_a_selector_wait_for_the_node_and_then_download() {
    let (_cluster, client) = setup("mc-late-node").await;
    let hub = StandIn::start().await;
    let commit = commit_id("tiny-1");
    hub.commit("acme/tiny", "main", &commit, files());
    model_cache(
        &client,
        "tiny",
        json!({"source": "hf://acme/tiny", "nodeSelector": {"pool": "a"}}),
    )
    .await
    .unwrap();
    model_cache(&client, "everywhere", json!({"source": "hf://acme/tiny"}))
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let running = start_agent_with(&client, "late", root.path(), &hub, |m| {
        m.resync = Duration::from_secs(3600);
    });
    let before = node_where(&client, "late", "the cache without a selector Ready", |n| {
        entry(n, "everywhere").is_some_and(|e| e.state == ModelCacheState::Ready)
    })
    .await;
    assert!(
        entry(&before, "tiny").is_none(),
        "no labels, no selector match"
    );
    node(&client, "late", "a").await;
    node_where(&client, "late", "tiny Ready once the Node is there", |n| {
        entry(n, "tiny").is_some_and(|e| e.state == ModelCacheState::Ready)
    })
    .await;
    running.stop().await;
}

/// A node whose model-cache disk has no room above `--min-free` (here all of it is kept
/// free): `NoSpace` with the numbers, before a byte of the model is written.
#[tokio::test]
async fn a_model_that_does_not_fit_the_free_space_fails_with_no_space() {
    let (_cluster, client) = setup("mc-no-space").await;
    let hub = StandIn::start().await;
    hub.commit("acme/tiny", "main", &commit_id("tiny-1"), files());
    node(&client, "full", "a").await;
    model_cache(&client, "tiny", json!({"source": "hf://acme/tiny"}))
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let running = start_agent_with(&client, "full", root.path(), &hub, |m| {
        m.min_free = kubeairunway_kernelcache_agent::space::Size::Percent(100);
    });
    let report = node_where(&client, "full", "tiny Failed", |n| {
        entry(n, "tiny").is_some_and(|e| e.state == ModelCacheState::Failed)
    })
    .await;
    let tiny = entry(&report, "tiny").unwrap();
    assert_eq!(tiny.reason.as_deref(), Some(reasons::NO_SPACE), "{tiny:?}");
    assert!(
        tiny.message
            .as_deref()
            .unwrap()
            .contains("kept free (--min-free)"),
        "{tiny:?}"
    );
    let blobs = root.path().join("models/hub/models--acme--tiny/blobs");
    assert!(
        std::fs::read_dir(&blobs).map_or(true, |mut d| d.next().is_none()),
        "nothing written"
    );
    assert!(
        hub.log().iter().all(|l| !l.path.contains("/resolve/")),
        "no file was requested"
    );
    let text = running.metrics.encode();
    assert!(
        text.contains(
            "kubeairunway_model_cache_downloads_total{status=\"failure\",reason=\"NoSpace\"}"
        ),
        "{text}"
    );
    running.stop().await;
}

#[tokio::test]
async fn model_cache_sources_are_checked_at_admission() {
    let (_cluster, client) = setup("mc-admission").await;
    for (source, message) in [
        ("s3://bucket/key", "source must be hf://org/name"),
        ("hf://only-org", "an hf:// source is hf://org/name"),
        ("hf://org/name/extra", "an hf:// source is hf://org/name"),
        ("oci://r.example/m:latest", "pinned to a digest"),
    ] {
        let e = model_cache(&client, "bad", json!({"source": source}))
            .await
            .unwrap_err();
        assert!(e.to_string().contains(message), "{source}: {e}");
    }
    let digest = "a".repeat(64);
    let pinned = format!("oci://r.example/m@sha256:{digest}");
    for (spec, message) in [
        (
            json!({"source": "hf://o/m", "modelId": "o/m"}),
            "modelId is for oci://",
        ),
        (
            json!({"source": pinned, "include": ["*.json"]}),
            "include is for hf://",
        ),
        (
            json!({"source": pinned, "credentialsSecretRef": {"name": "t", "key": "token"}}),
            "names a kubernetes.io/dockerconfigjson Secret, without key",
        ),
        (json!({"source": pinned, "modelId": "a/b/c"}), "modelId"),
    ] {
        let e = model_cache(&client, "bad", spec.clone()).await.unwrap_err();
        assert!(e.to_string().contains(message), "{spec}: {e}");
    }
    let oci = model_cache(
        &client,
        "oci",
        json!({"source": format!("oci://r.example/m@sha256:{digest}")}),
    )
    .await
    .unwrap();
    assert_eq!(oci.spec.revision(), "main");
    // Registry credentials of an oci:// source: a docker config Secret named, no key.
    model_cache(
        &client,
        "oci-private",
        json!({"source": pinned, "credentialsSecretRef": {"name": "regcred"}}),
    )
    .await
    .unwrap();
    let budget = model_cache(
        &client,
        "budget",
        json!({"source": "hf://o/m", "storageBudget": "not a quantity"}),
    )
    .await;
    assert!(budget.is_err(), "a budget is a quantity: {budget:?}");
    // The bound across nodes: at least one node downloads.
    let none = model_cache(
        &client,
        "bound",
        json!({"source": "hf://o/m", "download": {"maxNodes": 0}}),
    )
    .await
    .unwrap_err();
    assert!(none.to_string().contains("maxNodes"), "{none}");
    let one = model_cache(
        &client,
        "bound",
        json!({"source": "hf://o/m", "download": {"maxNodes": 1}}),
    )
    .await
    .unwrap();
    assert_eq!(one.spec.max_nodes(), Some(1));
}

/// The controller, as its chart's service account when helm is there (allowed to read the
/// user's Secret `hf-token` in the test namespace), until the returned sender is used.
pub(crate) async fn start_controller(
    cluster: &TestCluster,
    client: &Client,
) -> (
    Option<kubeairunway_e2e::rbac::ChartIdentity>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    start_controller_with(cluster, client, |_| {}).await
}

/// [`start_controller`] with its settings changed by `tweak` (the registry settings and
/// the policy of `oci://` sources), allowed to read the pull Secrets `hf-token`,
/// `regcred` and `othercred` of the test namespace.
pub(crate) async fn start_controller_with(
    cluster: &TestCluster,
    client: &Client,
    tweak: impl FnOnce(&mut kubeairunway_kernelcache_controller::Settings),
) -> (
    Option<kubeairunway_e2e::rbac::ChartIdentity>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    use kubeairunway_kernelcache_controller::{self as controller, Settings, metrics::Metrics};
    let identity = match kubeairunway_e2e::helm::require() {
        Some(helm_bin) => {
            let objects = kubeairunway_e2e::helm::template(
                &helm_bin,
                &kubeairunway_e2e::helm::chart("kernelcache-provider"),
                &[
                    ("controller.pullSecrets[0].namespace", NS),
                    ("controller.pullSecrets[0].names[0]", "hf-token"),
                    ("controller.pullSecrets[0].names[1]", "regcred"),
                    ("controller.pullSecrets[0].names[2]", "othercred"),
                    ("controller.pullSecrets[0].names[3]", "badcred"),
                ],
            )
            .unwrap();
            let deployment = objects
                .iter()
                .find(|o| {
                    o["kind"] == "Deployment"
                        && o["metadata"]["name"]
                            .as_str()
                            .is_some_and(|n| n.ends_with("-controller"))
                })
                .unwrap();
            Some(
                kubeairunway_e2e::rbac::ChartIdentity::apply(
                    cluster,
                    client,
                    &objects,
                    "kernelcache-controller",
                    deployment["metadata"]["namespace"].as_str().unwrap(),
                    deployment["spec"]["template"]["spec"]["serviceAccountName"]
                        .as_str()
                        .unwrap(),
                )
                .await
                .unwrap(),
            )
        }
        None => None,
    };
    let controller_client = match &identity {
        Some(id) => id.client(cluster).await.unwrap(),
        None => client.clone(),
    };
    let mut settings = Settings {
        resync: Duration::from_secs(2),
        credentials_namespace: Some(CREDENTIALS_NS.into()),
        model_cache_root: Some(MODEL_ROOT.into()),
        ..Settings::default()
    };
    tweak(&mut settings);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(controller::run(
        controller_client.clone(),
        settings,
        Arc::new(secrets::KubeSecrets(controller_client)),
        Arc::new(Metrics::default()),
        kubeairunway_sdk::process::Check::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    (identity, stop, task)
}

pub(crate) async fn cache_where(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&ModelCacheStatus) -> bool,
) -> ModelCacheStatus {
    let api: Api<ModelCache> = Api::namespaced(client.clone(), NS);
    let found = eventually(90, what, || async {
        api.get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|c| c.status)
            .filter(|s| check(s))
    })
    .await;
    match found {
        Ok(s) => s,
        Err(e) => {
            let last = api
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|c| c.status);
            panic!("{e}; last status of {name}: {last:#?}")
        }
    }
}

pub(crate) fn condition<'a>(s: &'a ModelCacheStatus, type_: &str) -> Option<(&'a str, &'a str)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

async fn node_labels(client: &Client, name: &str) -> BTreeMap<String, String> {
    Api::<Node>::all(client.clone())
        .get(name)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default()
}

#[tokio::test]
async fn the_controller_adds_up_the_nodes_labels_them_and_hands_the_token_over() {
    use kubeairunway_kernelcache_api::model::conditions;
    let (cluster, client) = setup("mc-controller").await;
    let hub = StandIn::start().await;
    let commit = commit_id("tiny-1");
    hub.commit("acme/tiny", "main", &commit, files());
    let gated_commit = commit_id("gated-1");
    hub.commit("acme/gated", "main", &gated_commit, files());
    hub.gate("acme/gated", "hf_right");
    for (name, pool) in [("gpu-a", "a"), ("gpu-b", "a"), ("cpu-c", "c")] {
        node(&client, name, pool).await;
    }
    // The user's Secret: the controller hands its token over, the agents read the copy.
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "hf-token", "namespace": NS},
                "stringData": {"token": "hf_right"},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let selector = json!({"pool": "a"});
    model_cache(
        &client,
        "tiny",
        json!({"source": "hf://acme/tiny", "nodeSelector": selector}),
    )
    .await
    .unwrap();
    model_cache(
        &client,
        "gated",
        json!({"source": "hf://acme/gated", "nodeSelector": selector,
               "credentialsSecretRef": {"name": "hf-token"}}),
    )
    .await
    .unwrap();
    let digest = "b".repeat(64);
    model_cache(
        &client,
        "oci",
        json!({"source": format!("oci://r.example/m@sha256:{digest}")}),
    )
    .await
    .unwrap();

    let (identity, stop, controller) = start_controller(&cluster, &client).await;
    let roots: BTreeMap<&str, tempfile::TempDir> = ["gpu-a", "gpu-b", "cpu-c"]
        .into_iter()
        .map(|n| (n, tempfile::tempdir().unwrap()))
        .collect();
    let agents: Vec<RunningAgent> = roots
        .iter()
        .map(|(n, root)| start_agent(&client, n, root.path(), &hub))
        .collect();

    let total: u64 = files().iter().map(|f| f.content.len()).sum();
    for name in ["tiny", "gated"] {
        let s = cache_where(&client, name, "Ready on the two selected nodes", |s| {
            s.ready_nodes == 2
        })
        .await;
        assert_eq!(
            condition(&s, conditions::READY),
            Some(("True", reasons::READY))
        );
        assert_eq!(
            condition(&s, conditions::ACCEPTED),
            Some(("True", reasons::ACCEPTED))
        );
        assert_eq!(s.nodes["Ready"], ["gpu-a", "gpu-b"]);
        assert_eq!(s.size_bytes, Some(i64::try_from(total).unwrap()));
        assert_eq!((s.downloading_nodes, s.failed_nodes), (0, 0));
        assert_eq!(s.observed_generation, Some(1));
    }
    let tiny = cache_where(&client, "tiny", "tiny's commit", |s| {
        s.resolved_commit.is_some()
    })
    .await;
    assert_eq!(tiny.resolved_commit.as_deref(), Some(commit.as_str()));
    assert_cached(
        roots["gpu-b"].path(),
        "models--acme--gated",
        &gated_commit,
        &files(),
    );
    // An oci:// source is accepted; its registry does not exist, so no node is ready.
    let oci = cache_where(&client, "oci", "oci accepted", |s| !s.conditions.is_empty()).await;
    assert_eq!(
        condition(&oci, conditions::ACCEPTED),
        Some(("True", reasons::ACCEPTED))
    );
    assert_eq!(oci.ready_nodes, 0);

    // The ready labels, for the later mount and affinity: on the two nodes only.
    for name in ["gpu-a", "gpu-b"] {
        eventually(60, "the model-cache labels", || async {
            let labels = node_labels(&client, name).await;
            (labels
                .get("modelcache.kubeairunway.ai/ml.tiny")
                .map(String::as_str)
                == Some("true")
                && labels
                    .get("modelcache.kubeairunway.ai/ml.gated")
                    .map(String::as_str)
                    == Some("true"))
            .then_some(())
        })
        .await
        .unwrap();
    }
    let c = node_labels(&client, "cpu-c").await;
    assert!(
        !c.keys()
            .any(|k| k.starts_with("modelcache.kubeairunway.ai/")),
        "{c:?}"
    );

    // The token reached the selected nodes only, sealed to each one's key: no Secret of
    // the namespace holds it in the clear, and cpu-c (not selected) has nothing.
    let handed = model_token_secret(NS, "gated");
    let secrets_api: Api<Secret> = Api::namespaced(client.clone(), CREDENTIALS_NS);
    let node_secret = kubeairunway_kernelcache_artifact::sealed::node_secret_name;
    for node in ["gpu-a", "gpu-b"] {
        let s = secrets_api.get(&node_secret(node)).await.unwrap();
        assert_eq!(
            s.data.unwrap().keys().collect::<Vec<_>>(),
            [&handed],
            "{node}: only the gated cache hands something over"
        );
    }
    assert!(
        secrets_api
            .get_opt(&node_secret("cpu-c"))
            .await
            .unwrap()
            .is_none()
    );
    for s in secrets_api
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
    {
        for (k, v) in s.data.unwrap_or_default() {
            assert!(
                !String::from_utf8_lossy(&v.0).contains("hf_right"),
                "{k} of {} holds the token in the clear",
                s.metadata.name.unwrap_or_default()
            );
        }
    }
    Api::<ModelCache>::namespaced(client.clone(), NS)
        .delete("gated", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    eventually(60, "the gated label removed", || async {
        let labels = node_labels(&client, "gpu-a").await;
        (!labels.contains_key("modelcache.kubeairunway.ai/ml.gated")
            && labels.contains_key("modelcache.kubeairunway.ai/ml.tiny"))
        .then_some(())
    })
    .await
    .unwrap();
    eventually(60, "the handed-over token removed", || async {
        secrets_api
            .get_opt(&node_secret("gpu-a"))
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await
    .unwrap();

    for a in agents {
        a.stop().await;
    }
    let _ = stop.send(());
    controller.await.unwrap().unwrap();
    drop(identity);
}
