//! The bound across nodes on concurrent downloads of a ModelCache
//! (`spec.download.maxNodes`): the controller (as its chart's service account, under the
//! chart's node-reports admission policy) grants the download slots in the nodes'
//! `KernelCacheNode.spec.modelDownloads`, the agents (in-process, one per fake node)
//! fetch a byte only with one, and a node whose files are complete needs none.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt as _};
use kubeairunway_e2e::eventually;
use kubeairunway_kernelcache_api::model::{ModelCacheState, NodeModelCache, reasons, slot_key};
use kubeairunway_kernelcache_api::{KernelCacheNode, KernelCacheNodeSpec};
use kubeairunway_modelcache_hub::testing::{StandIn, commit_id};
use serde_json::json;

use crate::modelcache::{
    NS, cache_where, files, model_cache, node, setup, start_agent, start_controller,
};

const BIG: &str = "model.safetensors";

fn entry<'a>(node: &'a KernelCacheNode, name: &str) -> Option<&'a NodeModelCache> {
    node.status
        .as_ref()?
        .model_caches
        .iter()
        .find(|c| c.name == name)
}

async fn reports(client: &Client) -> BTreeMap<String, KernelCacheNode> {
    Api::<KernelCacheNode>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .into_iter()
        .map(|n| (n.name_any(), n))
        .collect()
}

/// Whether anything of the repository's files is on the node (a blob or a partial one).
fn fetched_anything(root: &Path) -> bool {
    let blobs = root.join("models/hub/models--acme--tiny/blobs");
    std::fs::read_dir(blobs).is_ok_and(|mut d| d.next().is_some())
}

/// The chart's node-reports policy enforced for the controller's service account (when
/// helm is there): it may change only the spec of a KernelCacheNode but its nodeName.
async fn enforce_node_reports_policy(
    cluster: &kubeairunway_testcluster::TestCluster,
    admin: &Client,
    identity: &kubeairunway_e2e::rbac::ChartIdentity,
) {
    use kubeairunway_e2e::helm;
    let helm_bin = helm::require().expect("helm, as the controller's identity needed it");
    let objects = helm::template(&helm_bin, &helm::chart("kernelcache-provider"), &[]).unwrap();
    let policy = helm::of_kind(&objects, "ValidatingAdmissionPolicy")
        .iter()
        .find_map(|p| {
            p["metadata"]["name"]
                .as_str()
                .filter(|n| n.ends_with("-node-reports"))
        })
        .expect("the chart's node-reports policy")
        .to_string();
    let ours: Vec<serde_json::Value> = objects
        .iter()
        .filter(|o| o["metadata"]["name"] == policy.as_str())
        .cloned()
        .collect();
    kubeairunway_e2e::policy::apply(admin, &ours).await.unwrap();
    let api: Api<KernelCacheNode> = Api::all(admin.clone());
    api.create(
        &PostParams::default(),
        &KernelCacheNode::new(
            "probe",
            KernelCacheNodeSpec {
                node_name: "probe".into(),
                ..KernelCacheNodeSpec::default()
            },
        ),
    )
    .await
    .unwrap();
    let as_controller: Api<KernelCacheNode> = Api::all(identity.client(cluster).await.unwrap());
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let probe = Patch::Merge(json!({"spec": {"nodeName": "other"}}));
    kubeairunway_e2e::policy::until_denied(&policy, || {
        as_controller.patch("probe", &dry_run, &probe)
    })
    .await
    .unwrap();
    api.delete("probe", &DeleteParams::default()).await.unwrap();
}

/// With `maxNodes: 1` and two nodes, one node downloads while the other waits
/// (`Downloading`/`DownloadQueued`, nothing fetched), the slot staying with the first
/// across its agent's restart; once it is `Ready` the slot goes to the other, and both
/// end `Ready`. No two nodes ever hold a slot at once (watched on every change of the
/// reports). Then, with the controller stopped (nobody grants), a new generation and an
/// agent restart find the files complete and go `Ready` without a slot.
#[tokio::test]
async fn a_bounded_cache_downloads_on_one_node_at_a_time_and_complete_nodes_need_no_slot() {
    let (cluster, client) = setup("mc-slots").await;
    let hub = StandIn::start().await;
    let commit = commit_id("tiny-1");
    hub.commit("acme/tiny", "main", &commit, files());
    // The first node's download of the big file stalls after 4 MiB (the connection kept
    // open): it holds its slot for as long as the test wants.
    hub.stall_after(BIG, 4 << 20);
    for name in ["gpu-a", "gpu-b"] {
        node(&client, name, "a").await;
    }
    model_cache(
        &client,
        "tiny",
        json!({"source": "hf://acme/tiny", "download": {"maxNodes": 1}}),
    )
    .await
    .unwrap();

    // Every change of the reports: the most nodes holding a slot of the cache at once.
    let most = Arc::new(Mutex::new(0usize));
    let watching = {
        let most = Arc::clone(&most);
        let api: Api<KernelCacheNode> = Api::all(client.clone());
        tokio::spawn(async move {
            let mut holding: BTreeMap<String, bool> = BTreeMap::new();
            let key = slot_key(NS, "tiny");
            let mut events = watcher(api, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Some(Ok(n)) = events.next().await {
                let holds = n
                    .spec
                    .model_downloads
                    .as_ref()
                    .is_some_and(|g| g.contains_key(&key));
                holding.insert(n.name_any(), holds);
                let now = holding.values().filter(|h| **h).count();
                let mut m = most.lock().unwrap();
                *m = (*m).max(now);
            }
        })
    };

    let (identity, stop_controller, controller) = start_controller(&cluster, &client).await;
    if let Some(identity) = &identity {
        enforce_node_reports_policy(&cluster, &client, identity).await;
    }
    let roots: BTreeMap<&str, tempfile::TempDir> = ["gpu-a", "gpu-b"]
        .into_iter()
        .map(|n| (n, tempfile::tempdir().unwrap()))
        .collect();
    let mut agents: BTreeMap<&str, _> = roots
        .iter()
        .map(|(n, root)| (*n, start_agent(&client, n, root.path(), &hub)))
        .collect();

    // One downloads (and stalls), the other waits for the slot.
    let (first, second) = eventually(90, "one node downloading, the other queued", || async {
        let r = reports(&client).await;
        let fetching = |n: &str| {
            r.get(n)
                .and_then(|k| entry(k, "tiny"))
                .is_some_and(|e| e.state == ModelCacheState::Downloading && e.bytes_done > Some(0))
        };
        let queued = |n: &str| {
            r.get(n).and_then(|k| entry(k, "tiny")).is_some_and(|e| {
                e.state == ModelCacheState::Downloading
                    && e.reason.as_deref() == Some(reasons::DOWNLOAD_QUEUED)
            })
        };
        match (fetching("gpu-a"), fetching("gpu-b")) {
            (true, false) if queued("gpu-b") => Some(("gpu-a", "gpu-b")),
            (false, true) if queued("gpu-a") => Some(("gpu-b", "gpu-a")),
            _ => None,
        }
    })
    .await
    .unwrap();
    let r = reports(&client).await;
    let waiting = entry(&r[second], "tiny").unwrap();
    let message = waiting.message.clone().unwrap_or_default();
    assert!(
        message.contains("at most 1 node(s)") && message.contains("maxNodes"),
        "{message}"
    );
    assert_eq!(waiting.commit.as_deref(), Some(commit.as_str()), "resolved");
    assert_eq!(
        r[first].spec.model_downloads,
        Some(BTreeMap::from([(slot_key(NS, "tiny"), 1)]))
    );
    assert!(
        r[second]
            .spec
            .model_downloads
            .as_ref()
            .is_none_or(BTreeMap::is_empty),
        "{:?}",
        r[second].spec
    );
    assert!(
        !fetched_anything(roots[second].path()),
        "a queued node fetches nothing"
    );
    let s = cache_where(&client, "tiny", "both nodes downloading", |s| {
        s.downloading_nodes == 2
    })
    .await;
    assert_eq!(s.ready_nodes, 0);
    // It stays so while the first holds the slot (the stall lasts until the hub client's
    // idle timeout, 30 s: checked only while the first is still downloading).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = reports(&client).await;
    if entry(&r[first], "tiny").is_some_and(|e| e.state == ModelCacheState::Downloading) {
        assert_eq!(
            entry(&r[second], "tiny").and_then(|e| e.reason.as_deref()),
            Some(reasons::DOWNLOAD_QUEUED)
        );
        assert!(!fetched_anything(roots[second].path()));
    }

    // The first node's agent restarts mid-download: it keeps the slot and resumes.
    agents.remove(first).unwrap().stop().await;
    agents.insert(
        first,
        start_agent(&client, first, roots[first].path(), &hub),
    );
    let s = cache_where(&client, "tiny", "Ready on both nodes", |s| {
        s.ready_nodes == 2
    })
    .await;
    assert_eq!(s.nodes["Ready"], ["gpu-a", "gpu-b"]);
    assert_eq!(s.resolved_commit.as_deref(), Some(commit.as_str()));
    // The slots are released once the nodes are Ready.
    eventually(30, "no slot held", || async {
        let r = reports(&client).await;
        r.values()
            .all(|n| {
                n.spec
                    .model_downloads
                    .as_ref()
                    .is_none_or(|g| !g.contains_key(&slot_key(NS, "tiny")))
            })
            .then_some(())
    })
    .await
    .unwrap();
    assert_eq!(*most.lock().unwrap(), 1, "one node held the slot at a time");
    // Each node fetched the big file once (the first resumed with Range).
    assert!(hub.sent(BIG) < 3 * (6 << 20), "sent {}", hub.sent(BIG));

    // No controller: nobody grants. A new generation and a restarted agent find the
    // files complete and need no slot.
    let _ = stop_controller.send(());
    controller.await.unwrap().unwrap();
    model_cache(
        &client,
        "tiny",
        json!({"source": "hf://acme/tiny", "download": {"maxNodes": 1}, "storageBudget": "1Gi"}),
    )
    .await
    .unwrap();
    agents.remove(first).unwrap().stop().await;
    agents.insert(
        first,
        start_agent(&client, first, roots[first].path(), &hub),
    );
    eventually(90, "both Ready at generation 2 without a slot", || async {
        let r = reports(&client).await;
        ["gpu-a", "gpu-b"]
            .iter()
            .all(|n| {
                r.get(*n).and_then(|k| entry(k, "tiny")).is_some_and(|e| {
                    e.state == ModelCacheState::Ready && e.observed_generation == Some(2)
                })
            })
            .then_some(())
    })
    .await
    .unwrap();
    for (_, agent) in agents {
        agent.stop().await;
    }
    watching.abort();
}
