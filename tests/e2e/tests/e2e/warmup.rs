//! The warmup controller (`kernelcache-warmup`), in-process, against a real API server of
//! its own (Nodes are cluster-scoped, so no other test may see them). Nothing runs pods
//! there: [`Kubelet`] is the test stand-in for the kubelet of every node. It reports each
//! warmup pod the way the kubelet does (`pkg/kubelet/kubelet_pods.go@v1.34.0`
//! `getPhase`): a pod whose init container exits non-zero under `restartPolicy: Never`
//! is `Failed` with that container `terminated`; an image that cannot be pulled leaves the
//! pod `Pending` with the container `waiting` in `ImagePullBackOff`; a pod whose
//! containers all exited 0 is `Succeeded`. It also records how many warmup pods ran at
//! once, which is what `parallelism` bounds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kubeairunway_e2e::rbac::ChartIdentity;
use kubeairunway_e2e::{eventually, policy};
use kubeairunway_kernelcache_api::model::ModelCache;
use kubeairunway_kernelcache_warmup::metrics::Metrics;
use kubeairunway_kernelcache_warmup::pod::{ATTEMPT_ANNOTATION, NODE_ANNOTATION};
use kubeairunway_kernelcache_warmup::{self as warmup, Settings};
use kubeairunway_sdk::api::warmup::{Warmup, WarmupPhase, WarmupStatus};
use kubeairunway_testcluster::TestCluster;
use serde_json::{Value, json};

const TOOLS_IMAGE: &str = "ghcr.io/kubeairunway/kernelcache:test";

/// What the stand-in kubelet does with the pod of `(node, attempt)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Run {
    /// Every container exits 0.
    Succeed,
    /// The last init container (the last image to preload) exits 1.
    ExitNonZero,
    /// The last init container's image cannot be pulled.
    ImagePullBackOff,
    /// Keep running.
    Hang,
}

#[derive(Default, Debug)]
struct Seen {
    /// The most warmup pods running at the same time (created, not finished, not deleted).
    max_running: usize,
    /// Every pod seen, as `(node, attempt)`.
    pods: BTreeSet<(String, i32)>,
}

/// The test stand-in for the kubelets: polls the warmup pods of `ns`, holds each one
/// running for a moment (so overlap is observable), then writes the status `behave` says.
struct Kubelet {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Kubelet {
    fn start(client: Client, ns: &str, behave: impl Fn(&str, i32) -> Run + Send + 'static) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let pods: Api<Pod> = Api::namespaced(client, ns);
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                // Pods seen running, with the poll count when first seen.
                let mut first_seen: BTreeMap<String, u32> = BTreeMap::new();
                let mut tick = 0u32;
                loop {
                    tick += 1;
                    let Ok(list) = pods
                        .list(&ListParams::default().labels(warmup::pod::WARMUP_UID_LABEL))
                        .await
                    else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    let running: Vec<&Pod> = list
                        .items
                        .iter()
                        .filter(|p| p.metadata.deletion_timestamp.is_none())
                        .filter(|p| {
                            !matches!(
                                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                                Some("Succeeded" | "Failed")
                            )
                        })
                        .collect();
                    {
                        let mut s = seen.lock().unwrap();
                        s.max_running = s.max_running.max(running.len());
                        for p in &running {
                            let a = p.annotations();
                            s.pods.insert((
                                a[NODE_ANNOTATION].clone(),
                                a[ATTEMPT_ANNOTATION].parse().unwrap(),
                            ));
                        }
                    }
                    for p in running {
                        let name = p.name_any();
                        let since = *first_seen.entry(name.clone()).or_insert(tick);
                        if tick < since + 3 {
                            continue;
                        }
                        let a = p.annotations();
                        let run =
                            behave(&a[NODE_ANNOTATION], a[ATTEMPT_ANNOTATION].parse().unwrap());
                        if let Some(status) = kubelet_status(p, run) {
                            let _ = pods
                                .patch_status(
                                    &name,
                                    &PatchParams::default(),
                                    &Patch::Merge(&json!({"status": status})),
                                )
                                .await;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        Self { seen, task }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The status the kubelet writes for `pod` behaving as `run` (`None`: leave it).
fn kubelet_status(pod: &Pod, run: Run) -> Option<Value> {
    let spec = pod.spec.as_ref()?;
    let inits = spec.init_containers.clone().unwrap_or_default();
    let last = inits.last()?;
    let status = |c: &k8s_openapi::api::core::v1::Container, state: Value| {
        json!({"name": c.name, "image": c.image, "imageID": "", "ready": false,
               "restartCount": 0, "state": state})
    };
    let exited = |code: i32| json!({"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" }}});
    Some(match run {
        Run::Hang => return None,
        Run::Succeed => json!({
            "phase": "Succeeded",
            "initContainerStatuses": inits.iter().map(|c| status(c, exited(0))).collect::<Vec<_>>(),
            "containerStatuses": spec.containers.iter().map(|c| status(c, exited(0))).collect::<Vec<_>>(),
        }),
        Run::ExitNonZero => json!({
            "phase": "Failed",
            "initContainerStatuses": inits.iter().map(|c| {
                status(c, exited(i32::from(c.name == last.name)))
            }).collect::<Vec<_>>(),
        }),
        Run::ImagePullBackOff => json!({
            "phase": "Pending",
            "initContainerStatuses": inits.iter().map(|c| if c.name == last.name {
                status(c, json!({"waiting": {"reason": "ImagePullBackOff",
                    "message": format!("Back-off pulling image \"{}\"", c.image.clone().unwrap_or_default())}}))
            } else {
                status(c, exited(0))
            }).collect::<Vec<_>>(),
        }),
    })
}

/// The namespace and service account the chart runs the warmup controller as.
const CHART_NAMESPACE: &str = "kubeairunway-system";
const CHART_ACCOUNT: &str = "release-kernelcache-provider-warmup";
/// The chart's policy fencing the warmup controller's pods.
const PODS_POLICY: &str = "release-kernelcache-provider-warmup-pods";

/// The warmup controller started by [`start`]: stopped, and checked for refused requests,
/// when dropped.
struct Controller {
    _stop: tokio::sync::oneshot::Sender<()>,
    identity: ChartIdentity,
}

/// A private API server with our CRDs, and the warmup controller running on it under the
/// chart's service account, the RBAC the chart grants it (its requests are in the audit
/// log under that name; one the chart does not grant fails the test) and the chart's
/// admission policies, enforced before it starts. `None` when helm is missing outside CI.
async fn start(tag: &str) -> Option<(TestCluster, Client, Controller)> {
    // The warmup controller's warnings (a failed reconcile and why) go to stderr: a test
    // that times out under load then shows what the controller met.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "kubeairunway_kernelcache_warmup=warn",
        ))
        .with_writer(std::io::stderr)
        .try_init();
    let helm = kubeairunway_e2e::helm::require()?;
    let objects = kubeairunway_e2e::helm::template(
        &helm,
        &kubeairunway_e2e::helm::chart("kernelcache-provider"),
        &[],
    )
    .unwrap();
    let (cluster, client) =
        kubeairunway_sdk::testing::private_cluster(tag, &kubeairunway_kernelcache_api::crds())
            .await
            .unwrap();
    let identity = ChartIdentity::apply(
        &cluster,
        &client,
        &objects,
        "the warmup controller",
        CHART_NAMESPACE,
        CHART_ACCOUNT,
    )
    .await
    .unwrap();
    let controller = identity.client(&cluster).await.unwrap();
    // The policies, enforced before the controller's first request: a pod without the
    // managed-by label (a dry run) is refused.
    policy::apply(&client, &objects).await.unwrap();
    let probe = probe_pod(&json!({}), &json!([]));
    let (pods, dry_run) = (
        Api::<Pod>::namespaced(controller.clone(), CHART_NAMESPACE),
        dry_run(),
    );
    policy::until_denied(PODS_POLICY, || pods.create(&dry_run, &probe))
        .await
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let synced = kubeairunway_sdk::process::Check::default();
    tokio::spawn(warmup::run(
        controller,
        Settings {
            tools_image: TOOLS_IMAGE.into(),
            instance: Some("test".into()),
            custom_actions: warmup::policy::Policy::default(),
        },
        Arc::new(Metrics::default()),
        synced,
        async move {
            let _ = stopped.await;
        },
    ));
    Some((
        cluster,
        client,
        Controller {
            _stop: stop,
            identity,
        },
    ))
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

/// A pod named `probe` with `labels` and `owners` (owner references).
fn probe_pod(labels: &Value, owners: &Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probe", "labels": labels, "ownerReferences": owners},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]},
    }))
    .unwrap()
}

async fn node(client: &Client, name: &str, labels: Value) {
    let nodes: Api<Node> = Api::all(client.clone());
    let body =
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}});
    nodes
        .patch(
            name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
}

async fn create_warmup(
    client: &Client,
    ns: &str,
    name: &str,
    spec: Value,
) -> Result<Warmup, kube::Error> {
    let api: Api<Warmup> = Api::namespaced(client.clone(), ns);
    let body = json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "Warmup",
                      "metadata": {"name": name}, "spec": spec});
    api.create(
        &PostParams::default(),
        &serde_json::from_value(body).unwrap(),
    )
    .await
}

/// The Warmup's status once `check` holds (two minutes at most: slow when the machine runs
/// other tests' API servers too).
async fn status_where(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&WarmupStatus) -> bool,
) -> WarmupStatus {
    let api: Api<Warmup> = Api::namespaced(client.clone(), ns);
    let last = Mutex::new(None);
    eventually(120, what, || async {
        let s = api.get(name).await.ok()?.status.unwrap_or_default();
        *last.lock().unwrap() = Some(s.clone());
        check(&s).then_some(s)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; last status: {:?}", last.lock().unwrap()))
}

async fn events(client: &Client, ns: &str, warmup: &str) -> Vec<(String, String)> {
    let api: Api<K8sEvent> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(warmup))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// Wait until two warmup pods of `ns` have succeeded (four minutes at most: two
/// controllers and a node stand-in on a private API server are slow when the machine runs
/// other tests' servers too).
async fn both_pods_succeed(client: &Client, ns: &str) {
    let done = eventually(240, "both warmup pods to succeed", || async {
        let pods = warmup_pods(client, ns).await;
        let succeeded = pods
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
            .count();
        (succeeded == 2).then_some(pods)
    })
    .await;
    assert!(done.is_ok(), "{done:?}");
}

async fn warmup_pods(client: &Client, ns: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().labels(warmup::pod::WARMUP_UID_LABEL))
        .await
        .unwrap()
        .items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_warmed_in_parallel_retried_joined_and_cleaned_up_after_the_ttl() {
    let Some((cluster, client, _controller)) = start("warmup-nodes").await else {
        return;
    };
    let ns = cluster.namespace("warmup");
    for n in ["gpu-1", "gpu-2", "gpu-3", "gpu-4"] {
        node(&client, n, json!({"pool": "a100"})).await;
    }
    node(&client, "cpu-1", json!({"pool": "cpu"})).await;
    // The kubelet of gpu-2 fails its first two attempts; every other attempt succeeds.
    let kubelet = Kubelet::start(client.clone(), &ns, |node, attempt| {
        if node == "gpu-2" && attempt < 2 {
            Run::ExitNonZero
        } else {
            Run::Succeed
        }
    });

    // The API server refuses what the CRD's rules refuse.
    let both = create_warmup(
        &client,
        &ns,
        "both",
        json!({
        "targetNodes": {"nodeNames": ["gpu-1"]}, "targetModelDeployment": {"name": "m"},
        "imagesPreload": {"items": ["vllm/vllm-openai:v0.11.0"]}}),
    )
    .await;
    assert!(
        matches!(&both, Err(kube::Error::Api(s)) if s.message.contains("exactly one of targetNodes or targetModelDeployment")),
        "{both:?}"
    );
    let idle = create_warmup(
        &client,
        &ns,
        "idle",
        json!({"targetNodes": {"nodeNames": ["gpu-1"]}}),
    )
    .await;
    assert!(
        matches!(&idle, Err(kube::Error::Api(s)) if s.message.contains("at least one of imagesPreload")),
        "{idle:?}"
    );
    let always = create_warmup(&client, &ns, "always", json!({"targetNodes": {"nodeNames": ["gpu-1"]},
        "customAction": {"podTemplate": {"spec": {"restartPolicy": "Always", "containers": [{"name": "c", "image": "busybox:1.36"}]}}}})).await;
    assert!(
        matches!(&always, Err(kube::Error::Api(s)) if s.message.contains("restartPolicy")),
        "{always:?}"
    );

    create_warmup(
        &client,
        &ns,
        "preload",
        json!({
            "targetNodes": {"nodeSelector": {"pool": "a100"}, "nodeNames": ["cpu-1"]},
            "imagesPreload": {"items": ["vllm/vllm-openai:v0.11.0", "busybox:1.36"]},
            "policies": {"parallelism": 2, "backoffLimitPerNode": 2, "ttlSecondsAfterFinished": 4},
        }),
    )
    .await
    .unwrap();
    status_where(&client, &ns, "preload", "InProgress", |s| {
        s.phase == Some(WarmupPhase::InProgress)
    })
    .await;
    // A node that joins the pool while the warmup runs is warmed too.
    node(&client, "gpu-5", json!({"pool": "a100"})).await;

    let s = status_where(&client, &ns, "preload", "Completed", |s| {
        s.phase == Some(WarmupPhase::Completed)
    })
    .await;
    assert_eq!(
        (
            s.desired_nodes,
            s.succeeded_nodes,
            s.failed_nodes,
            s.active_nodes
        ),
        (6, 6, 0, 0),
        "{s:?}"
    );
    assert_eq!(s.images, ["vllm/vllm-openai:v0.11.0", "busybox:1.36"]);
    let retried = s.failures.iter().find(|f| f.node_name == "gpu-2").unwrap();
    assert_eq!(
        (retried.attempts, retried.permanent, retried.reason.as_str()),
        (2, false, "PodFailed"),
        "{s:?}; pods: {:?}",
        warmup_pods(&client, &ns)
            .await
            .iter()
            .map(|p| (
                p.name_any(),
                p.annotations().clone(),
                p.status.clone().and_then(|s| s.phase)
            ))
            .collect::<Vec<_>>()
    );
    assert!(
        retried.message.contains("exited with code 1"),
        "{retried:?}"
    );
    assert!(s.start_time.is_some() && s.completion_time.is_some());
    {
        let seen = kubelet.seen();
        assert!(seen.max_running <= 2, "parallelism 2 exceeded: {seen:?}");
        assert_eq!(
            seen.max_running, 2,
            "the warmup ran nodes in parallel: {seen:?}"
        );
        let attempts: Vec<_> = seen.pods.iter().filter(|(n, _)| n == "gpu-2").collect();
        assert_eq!(attempts.len(), 3, "{seen:?}");
    }

    // Each pod is pinned to its node, preloads every image with the no-op and runs nothing
    // privileged.
    let pods = warmup_pods(&client, &ns).await;
    let p = pods
        .iter()
        .find(|p| p.annotations()[NODE_ANNOTATION] == "gpu-3")
        .unwrap();
    let spec = p.spec.as_ref().unwrap();
    let terms = &spec
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    let pinned = serde_json::to_value(terms).unwrap();
    assert_eq!(
        pinned[0]["matchFields"][0]["values"],
        json!(["gpu-3"]),
        "{pinned}"
    );
    let inits = spec.init_containers.as_ref().unwrap();
    assert_eq!(inits[0].image.as_deref(), Some(TOOLS_IMAGE));
    let images: Vec<_> = inits[1..]
        .iter()
        .map(|c| c.image.clone().unwrap())
        .collect();
    assert_eq!(images, ["vllm/vllm-openai:v0.11.0", "busybox:1.36"]);
    assert!(inits[1].command.as_ref().unwrap()[0].ends_with("kernelcache-noop"));
    assert_eq!(p.owner_references()[0].kind, "Warmup");

    let events = events(&client, &ns, "preload").await;
    let count = |r: &str| events.iter().filter(|(reason, _)| reason == r).count();
    assert_eq!(count("NodeWarmed"), 6, "{events:?}");
    // gpu-2's two retries are one event with a series of two (kube's recorder).
    assert_eq!(count("NodeRetrying"), 1, "{events:?}");
    let all: Api<K8sEvent> = Api::namespaced(client.clone(), &ns);
    let retrying = eventually(10, "a series of two NodeRetrying", || async {
        all.list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("NodeRetrying")
                    && e.series.as_ref().is_some_and(|s| s.count == 2)
            })
    })
    .await;
    assert!(retrying.is_ok(), "{events:?}");
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "NodeRetrying" && n.contains("gpu-2")),
        "{events:?}"
    );
    assert_eq!(count("WarmupStarted"), 1, "{events:?}");
    assert_eq!(count("NodesWarmed"), 1, "{events:?}");

    // ttlSecondsAfterFinished: the Warmup and its pods go.
    let api: Api<Warmup> = Api::namespaced(client.clone(), &ns);
    eventually(30, "the Warmup deleted after its TTL", || async {
        api.get_opt("preload").await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();
    eventually(30, "its pods deleted", || async {
        warmup_pods(&client, &ns).await.is_empty().then_some(())
    })
    .await
    .unwrap();

    // The chart grants the controller what it used here, and nothing more (leader
    // election is not run in-process: its Role is left out).
    let Some(helm) = kubeairunway_e2e::helm::require() else {
        return;
    };
    let objects = kubeairunway_e2e::helm::template(
        &helm,
        &kubeairunway_e2e::helm::chart("kernelcache-provider"),
        &[],
    )
    .unwrap();
    let rules: Vec<_> =
        kubeairunway_e2e::rbac::granted_rules(&objects, CHART_NAMESPACE, CHART_ACCOUNT)
            .into_iter()
            .filter(|r| !r.resources.contains(&"leases".to_string()))
            .collect();
    assert!(!rules.is_empty(), "the chart binds the warmup's account");
    let measured = kubeairunway_e2e::rbac::measure(
        &rules,
        &cluster.audit_events().unwrap(),
        &kubeairunway_testcluster::service_account_user(CHART_NAMESPACE, CHART_ACCOUNT),
    );
    assert!(measured.is_least_privilege(), "{measured:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_nodes_the_global_timeout_and_deletion_stop_a_warmup() {
    let Some((cluster, client, _controller)) = start("warmup-stop").await else {
        return;
    };
    for n in ["n-1", "n-2", "n-3", "n-4"] {
        node(&client, n, json!({"pool": "h100"})).await;
    }

    // maxFailedNodes 0, no retries: the first node whose image cannot be pulled fails the
    // warmup, and no other node starts.
    let ns = cluster.namespace("warmup-fail");
    let kubelet = Kubelet::start(client.clone(), &ns, |_, _| Run::ImagePullBackOff);
    create_warmup(
        &client,
        &ns,
        "fail",
        json!({
            "targetNodes": {"nodeSelector": {"pool": "h100"}},
            "imagesPreload": {"items": ["registry.invalid/missing:1"]},
            "policies": {"parallelism": 1, "backoffLimitPerNode": 0, "maxFailedNodes": 0},
        }),
    )
    .await
    .unwrap();
    let s = status_where(&client, &ns, "fail", "Failed", |s| {
        s.phase == Some(WarmupPhase::Failed)
    })
    .await;
    let failed = s.conditions.iter().find(|c| c.type_ == "Failed").unwrap();
    assert_eq!(failed.reason, "MaxFailedNodesExceeded", "{s:?}");
    assert_eq!(
        (s.failed_nodes, s.succeeded_nodes, s.active_nodes),
        (1, 0, 0),
        "{s:?}"
    );
    assert_eq!(s.failures[0].reason, "ImagePullBackOff");
    assert!(
        s.failures[0].permanent && s.failures[0].message.contains("registry.invalid/missing:1"),
        "{s:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        kubelet.seen().pods.len(),
        1,
        "the rollout stopped: {:?}",
        kubelet.seen()
    );
    eventually(30, "the stuck pod deleted", || async {
        warmup_pods(&client, &ns).await.is_empty().then_some(())
    })
    .await
    .unwrap();
    let ev = events(&client, &ns, "fail").await;
    assert!(
        ev.iter()
            .any(|(r, n)| r == "NodeFailed" && n.contains("ImagePullBackOff")),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(|(r, _)| r == "MaxFailedNodesExceeded"),
        "{ev:?}"
    );
    drop(kubelet);

    // globalTimeoutSeconds: pods that never finish fail the warmup, and are deleted.
    let ns = cluster.namespace("warmup-timeout");
    let _kubelet = Kubelet::start(client.clone(), &ns, |_, _| Run::Hang);
    create_warmup(&client, &ns, "slow", json!({
        "targetNodes": {"nodeNames": ["n-1", "n-2"]},
        "customAction": {"podTemplate": {"spec": {"containers": [{"name": "download", "image": "python:3.12", "command": ["sleep", "3600"]}]}}},
        "policies": {"globalTimeoutSeconds": 3},
    })).await.unwrap();
    eventually(30, "both pods running", || async {
        (warmup_pods(&client, &ns).await.len() == 2).then_some(())
    })
    .await
    .unwrap();
    let s = status_where(&client, &ns, "slow", "Failed", |s| {
        s.phase == Some(WarmupPhase::Failed)
    })
    .await;
    let failed = s.conditions.iter().find(|c| c.type_ == "Failed").unwrap();
    assert_eq!(failed.reason, "GlobalTimeoutExceeded", "{s:?}");
    eventually(30, "the running pods deleted", || async {
        warmup_pods(&client, &ns).await.is_empty().then_some(())
    })
    .await
    .unwrap();

    // Deleting a running Warmup deletes its pods.
    create_warmup(
        &client,
        &ns,
        "deleted",
        json!({
            "targetNodes": {"nodeNames": ["n-3"]},
            "imagesPreload": {"items": ["busybox:1.36"]},
        }),
    )
    .await
    .unwrap();
    eventually(30, "its pod", || async {
        (warmup_pods(&client, &ns).await.len() == 1).then_some(())
    })
    .await
    .unwrap();
    let api: Api<Warmup> = Api::namespaced(client.clone(), &ns);
    api.delete("deleted", &DeleteParams::default())
        .await
        .unwrap();
    eventually(30, "its pod deleted with it", || async {
        warmup_pods(&client, &ns).await.is_empty().then_some(())
    })
    .await
    .unwrap();
}

/// A Node with `gpus` of `nvidia.com/gpu` allocatable (written to its status, as the
/// kubelet and the device plugin report them) and `taints`.
async fn gpu_node(client: &Client, name: &str, labels: Value, gpus: u32, taints: Value) {
    let nodes: Api<Node> = Api::all(client.clone());
    let body = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                      "spec": {"taints": taints}});
    nodes
        .patch(
            name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
    let status =
        json!({"status": {"allocatable": {"cpu": "32", "nvidia.com/gpu": gpus.to_string()}}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// What the kernel-cache agent on `node` reports for KernelCache `cache` of `ns`, under
/// the agent's field manager.
async fn agent_report(
    client: &Client,
    node: &str,
    ns: &str,
    cache: &str,
    digest: &str,
    state: &str,
) {
    agent_status(
        client,
        node,
        json!({"gpuCount": 1, "caches": [{"namespace": ns, "name": cache, "digest": digest, "state": state}]}),
    )
    .await;
}

/// `status` as the cache agent on `node` reports it in its KernelCacheNode, under the
/// agent's field manager.
async fn agent_status(client: &Client, node: &str, status: Value) {
    let api: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &kube::discovery::ApiResource::erase::<kubeairunway_kernelcache_api::KernelCacheNode>(&()),
    );
    let spec = json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCacheNode",
                      "metadata": {"name": node}, "spec": {"nodeName": node}});
    api.patch(
        node,
        &PatchParams::apply("kernelcache-agent").force(),
        &Patch::Apply(&spec),
    )
    .await
    .unwrap();
    let status = json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCacheNode",
        "metadata": {"name": node}, "status": status});
    api.patch_status(
        node,
        &PatchParams::apply("kernelcache-agent").force(),
        &Patch::Apply(&status),
    )
    .await
    .unwrap();
}

/// Write `status.provider.images` of `md` for its generation, as its provider's runtime
/// does (under a provider's field manager).
async fn provider_reports_images(
    client: &Client,
    md: &kubeairunway_sdk::ModelDeployment,
    images: &[&str],
) {
    let mds: Api<kubeairunway_sdk::ModelDeployment> =
        Api::namespaced(client.clone(), &md.namespace().unwrap());
    let status = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": md.name_any()},
        "status": {"observedGeneration": md.metadata.generation, "provider": {"images": images}}});
    mds.patch_status(
        &md.name_any(),
        &PatchParams::apply("test-provider").force(),
        &Patch::Apply(&status),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_deployments_nodes_get_its_image_and_its_kernel_cache() {
    let Some((cluster, client, _controller)) = start("warmup-model").await else {
        return;
    };
    let ns = cluster.namespace("warmup-model");
    let tainted = json!([{"key": "dedicated", "value": "llm", "effect": "NoSchedule"}]);
    gpu_node(&client, "h100-1", json!({"pool": "h100"}), 8, json!([])).await;
    gpu_node(
        &client,
        "h100-2",
        json!({"pool": "h100"}),
        8,
        tainted.clone(),
    )
    .await;
    gpu_node(&client, "h100-cpu", json!({"pool": "h100"}), 0, json!([])).await;
    gpu_node(&client, "a10-1", json!({"pool": "a10"}), 1, json!([])).await;
    gpu_node(
        &client,
        "h100-other",
        json!({"pool": "h100"}),
        8,
        json!([{"key": "other", "effect": "NoExecute"}]),
    )
    .await;
    let _kubelet = Kubelet::start(client.clone(), &ns, |_, _| Run::Succeed);

    // The model runs on pool h100, tolerates `dedicated`, needs a GPU, and names its
    // image and kernel cache.
    let mds: Api<kubeairunway_sdk::ModelDeployment> = Api::namespaced(client.clone(), &ns);
    let md = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": "llama"},
        "spec": {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "engine": {"type": "vllm"},
                 "image": "vllm/vllm-openai:v0.11.0",
                 "resources": {"gpu": {"count": 1, "type": "nvidia.com/gpu"}},
                 "nodeSelector": {"pool": "h100"},
                 "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
                 "kernelCache": {"name": "llama-kernels"}}});
    let md = mds
        .patch(
            "llama",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&md),
        )
        .await
        .unwrap();
    // The images its provider renders, as the provider runtime reports them (the warmup
    // without imagesPreload preloads those; `a_gated_model_deployment_...` runs a real
    // provider for it).
    provider_reports_images(&client, &md, &["vllm/vllm-openai:v0.11.0"]).await;
    // The KernelCache as the cache controller leaves it once it pinned and verified it
    // (kernelcache_controller.rs runs the real controller for that); written here under
    // its field manager, since this test is about the warmup.
    let digest = format!("sha256:{}", "ab".repeat(32));
    let caches: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::discovery::ApiResource::erase::<kubeairunway_kernelcache_api::KernelCache>(&()),
    );
    let cache = json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCache",
        "metadata": {"name": "llama-kernels"}, "spec": {"image": "registry.example/kernels/llama:v1", "nodeSelector": {"pool": "h100"}}});
    caches
        .patch(
            "llama-kernels",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&cache),
        )
        .await
        .unwrap();
    let verdict = json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCache",
        "metadata": {"name": "llama-kernels"},
        "status": {"resolvedDigest": digest, "pinnedImage": format!("registry.example/kernels/llama@{digest}"),
                   "verification": {"mode": "key", "verified": true}}});
    caches
        .patch_status(
            "llama-kernels",
            &PatchParams::apply("kernelcache-controller").force(),
            &Patch::Apply(&verdict),
        )
        .await
        .unwrap();
    agent_report(&client, "h100-1", &ns, "llama-kernels", &digest, "Ready").await;
    agent_report(&client, "h100-2", &ns, "llama-kernels", &digest, "Staging").await;

    create_warmup(
        &client,
        &ns,
        "llama",
        json!({"targetModelDeployment": {"name": "llama"},
        "policies": {"parallelism": 1}}),
    )
    .await
    .unwrap();
    // h100-2's pod is done, but its cache is still staging: the node is not warm yet.
    // (The controller writes a node as active before it creates its pod, so the status
    // alone cannot tell a pod about to be made from a done pod held by its cache: both
    // pods are waited for first.)
    both_pods_succeed(&client, &ns).await;
    let s = status_where(
        &client,
        &ns,
        "llama",
        "both pods done, h100-2 still staging",
        |s| {
            s.phase == Some(WarmupPhase::InProgress)
                && s.succeeded_nodes == 1
                && s.active_nodes == 1
        },
    )
    .await;
    assert_eq!(
        s.desired_nodes, 2,
        "only h100-1 and h100-2 can run the model: {s:?}"
    );
    assert_eq!(s.images, ["vllm/vllm-openai:v0.11.0"]);
    let pods = warmup_pods(&client, &ns).await;
    let mut nodes: Vec<_> = pods
        .iter()
        .map(|p| p.annotations()[NODE_ANNOTATION].clone())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["h100-1", "h100-2"]);
    let tolerations = pods[0]
        .spec
        .as_ref()
        .unwrap()
        .tolerations
        .clone()
        .unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some("dedicated")),
        "{tolerations:?}"
    );

    agent_report(&client, "h100-2", &ns, "llama-kernels", &digest, "Ready").await;
    let s = status_where(&client, &ns, "llama", "Completed", |s| {
        s.phase == Some(WarmupPhase::Completed)
    })
    .await;
    assert_eq!(
        (s.desired_nodes, s.succeeded_nodes, s.failed_nodes),
        (2, 2, 0),
        "{s:?}"
    );

    // A cache that does not exist (yet) is waited for, until the global timeout.
    create_warmup(
        &client,
        &ns,
        "missing",
        json!({"targetNodes": {"nodeNames": ["h100-1"]},
        "kernelCaches": ["nope"], "policies": {"globalTimeoutSeconds": 2}}),
    )
    .await
    .unwrap();
    let s = status_where(&client, &ns, "missing", "Failed", |s| {
        s.phase == Some(WarmupPhase::Failed)
    })
    .await;
    let failed = s.conditions.iter().find(|c| c.type_ == "Failed").unwrap();
    assert_eq!(failed.reason, "GlobalTimeoutExceeded", "{s:?}");
    assert_eq!((s.desired_nodes, s.succeeded_nodes), (1, 0), "{s:?}");
}

/// What the cache agent on `node` reports for ModelCache `cache` of `ns` at `generation`,
/// under the agent's field manager.
async fn agent_model_report(
    client: &Client,
    node: &str,
    ns: &str,
    cache: &str,
    generation: i64,
    state: &str,
) {
    agent_status(
        client,
        node,
        json!({"gpuCount": 1, "modelCaches": [{"namespace": ns, "name": cache,
            "observedGeneration": generation, "state": state, "bytesDone": 5, "bytesTotal": 10}]}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_deployments_nodes_wait_for_its_model_cache_and_named_ones() {
    let Some((cluster, client, _controller)) = start("warmup-modelcache").await else {
        return;
    };
    let ns = cluster.namespace("warmup-modelcache");
    gpu_node(&client, "h100-1", json!({"pool": "h100"}), 8, json!([])).await;
    gpu_node(&client, "h100-2", json!({"pool": "h100"}), 8, json!([])).await;
    gpu_node(&client, "a10-1", json!({"pool": "a10"}), 1, json!([])).await;
    let _kubelet = Kubelet::start(client.clone(), &ns, |_, _| Run::Succeed);

    // The model runs on pool h100; a ModelCache of its model (not Ready yet: its pods
    // would mount it once it is) downloads on that pool.
    let mds: Api<kubeairunway_sdk::ModelDeployment> = Api::namespaced(client.clone(), &ns);
    let md = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": "tiny"},
        "spec": {"model": {"id": "acme/tiny"}, "engine": {"type": "vllm"},
                 "image": "vllm/vllm-openai:v0.11.0",
                 "resources": {"gpu": {"count": 1, "type": "nvidia.com/gpu"}},
                 "nodeSelector": {"pool": "h100"}}});
    let md = mds
        .patch(
            "tiny",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&md),
        )
        .await
        .unwrap();
    provider_reports_images(&client, &md, &["vllm/vllm-openai:v0.11.0"]).await;
    let caches: Api<ModelCache> = Api::namespaced(client.clone(), &ns);
    let cache = caches
        .patch(
            "tiny",
            &PatchParams::apply("test").force(),
            &Patch::Apply(
                json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "ModelCache",
                "metadata": {"name": "tiny"},
                "spec": {"source": "hf://acme/tiny", "nodeSelector": {"pool": "h100"}}}),
            ),
        )
        .await
        .unwrap();
    let generation = cache.metadata.generation.unwrap();
    agent_model_report(&client, "h100-1", &ns, "tiny", generation, "Ready").await;
    agent_model_report(&client, "h100-2", &ns, "tiny", generation, "Downloading").await;

    create_warmup(
        &client,
        &ns,
        "tiny",
        json!({"targetModelDeployment": {"name": "tiny"}}),
    )
    .await
    .unwrap();
    both_pods_succeed(&client, &ns).await;
    // h100-2's pod is done but its download is not: the node is not warm.
    let s = status_where(&client, &ns, "tiny", "h100-2 still downloading", |s| {
        s.phase == Some(WarmupPhase::InProgress) && s.succeeded_nodes == 1 && s.active_nodes == 1
    })
    .await;
    assert_eq!(s.desired_nodes, 2, "{s:?}");
    agent_model_report(&client, "h100-2", &ns, "tiny", generation, "Ready").await;
    let s = status_where(&client, &ns, "tiny", "Completed", |s| {
        s.phase == Some(WarmupPhase::Completed)
    })
    .await;
    assert_eq!((s.succeeded_nodes, s.failed_nodes), (2, 0), "{s:?}");

    // Named by a Warmup: a node the cache does not select fails with the reason, one
    // whose report is of an older generation waits.
    create_warmup(
        &client,
        &ns,
        "named",
        json!({"targetNodes": {"nodeNames": ["h100-1", "a10-1"]}, "modelCaches": ["tiny"],
               "policies": {"maxFailedNodes": 1, "backoffLimitPerNode": 0}}),
    )
    .await
    .unwrap();
    let s = status_where(&client, &ns, "named", "a10-1 failed, h100-1 warm", |s| {
        s.succeeded_nodes == 1 && s.failed_nodes == 1
    })
    .await;
    let failure = s.failures.iter().find(|f| f.node_name == "a10-1").unwrap();
    assert_eq!(failure.reason, "ModelCacheNotTargeted", "{s:?}");
    assert!(failure.message.contains("ModelCache 'tiny'"), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_names_without_a_node_fail_at_once_and_count_against_max_failed_nodes() {
    let Some((cluster, client, _controller)) = start("warmup-names").await else {
        return;
    };
    let ns = cluster.namespace("warmup-names");
    node(&client, "real-1", json!({})).await;
    let _kubelet = Kubelet::start(client.clone(), &ns, |_, _| Run::Succeed);

    // No global timeout: a warmup that waited for the missing node would never end.
    create_warmup(
        &client,
        &ns,
        "tolerated",
        json!({"targetNodes": {"nodeNames": ["real-1", "no-such-node"]},
               "imagesPreload": {"items": ["busybox:1.36"]},
               "policies": {"backoffLimitPerNode": 0, "maxFailedNodes": 1}}),
    )
    .await
    .unwrap();
    let s = status_where(&client, &ns, "tolerated", "Completed", |s| {
        s.phase == Some(WarmupPhase::Completed)
    })
    .await;
    assert_eq!(
        (s.desired_nodes, s.succeeded_nodes, s.failed_nodes),
        (2, 1, 1),
        "{s:?}"
    );
    let f = &s.failures[0];
    assert_eq!(
        (f.node_name.as_str(), f.reason.as_str(), f.permanent),
        ("no-such-node", "NodeNotFound", true),
        "{s:?}"
    );
    assert!(f.message.contains("no Node 'no-such-node'"), "{f:?}");

    // Two missing nodes where one is tolerated: failed at once, no pod made.
    create_warmup(
        &client,
        &ns,
        "exceeded",
        json!({"targetNodes": {"nodeNames": ["real-1", "gone-1", "gone-2"]},
               "imagesPreload": {"items": ["busybox:1.36"]},
               "policies": {"backoffLimitPerNode": 0, "maxFailedNodes": 1}}),
    )
    .await
    .unwrap();
    let s = status_where(&client, &ns, "exceeded", "Failed", |s| {
        s.phase == Some(WarmupPhase::Failed)
    })
    .await;
    let failed = s.conditions.iter().find(|c| c.type_ == "Failed").unwrap();
    assert_eq!(failed.reason, "MaxFailedNodesExceeded", "{s:?}");
    assert_eq!((s.failed_nodes, s.succeeded_nodes), (2, 0), "{s:?}");
    let api: Api<Warmup> = Api::namespaced(client.clone(), &ns);
    let uid = api.get("exceeded").await.unwrap().uid().unwrap();
    assert!(
        warmup_pods(&client, &ns)
            .await
            .iter()
            .all(|p| p.labels()[warmup::pod::WARMUP_UID_LABEL] != uid),
        "no pod for a warmup that failed on its first look"
    );
    let ev = events(&client, &ns, "exceeded").await;
    assert!(
        ev.iter()
            .any(|(r, n)| r == "NodeFailed" && n.contains("gone-1") && n.contains("NodeNotFound")),
        "{ev:?}"
    );
}

/// A ModelDeployment with `spec.warmup`, served by the SDK's example Deployment provider
/// (in-process, on the same API server as the warmup controller): nothing is created
/// while its Warmup is missing or in progress, the condition `WarmedUp` says why, the
/// Warmup preloads the images the provider reports, and once the test (playing the
/// kubelet) lets the warmup pods finish, the Deployment is created at full scale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_model_deployment_waits_for_its_warmup_then_scales_up() {
    use kubeairunway_sdk::api::{DeploymentWarmup, EngineType, Phase};
    use kubeairunway_sdk::conditions::{RESOURCE_CREATED, WARMED_UP, reasons};
    use kubeairunway_sdk::testing::{self, ModelDeploymentBuilder, condition, md_where};
    use std::sync::atomic::{AtomicBool, Ordering};

    let Some((cluster, client, _controller)) = start("warmup-gate").await else {
        return;
    };
    let ns = cluster.namespace("warmup-gate");
    gpu_node(&client, "h100-1", json!({"pool": "h100"}), 8, json!([])).await;
    let release = Arc::new(AtomicBool::new(false));
    let _kubelet = Kubelet::start(client.clone(), &ns, {
        let release = release.clone();
        move |_, _| {
            if release.load(Ordering::SeqCst) {
                Run::Succeed
            } else {
                Run::Hang
            }
        }
    });
    let provider = "gate-e2e";
    let _running = testing::spawn(
        kubeairunway_deployment_provider::DeploymentProvider::named(provider),
        client.clone(),
        testing::test_options(),
    );
    let md = ModelDeploymentBuilder::new("qwen")
        .namespace(&ns)
        .model("Qwen/Qwen3-0.6B")
        .engine(EngineType::Vllm)
        .gpus(1)
        .replicas(2)
        .provider(provider)
        .spec(|s| {
            s.warmup = Some(DeploymentWarmup::named("qwen-warm"));
        })
        .build();
    testing::deploy(&client, &md, provider).await.unwrap();
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), &ns);

    // No Warmup of that name: held, and said so; the images are reported all the same.
    let held = md_where(
        &client,
        &ns,
        "qwen",
        "WarmedUp=False, WarmupNotFound",
        |m| condition(m, WARMED_UP).is_some_and(|c| c.reason == reasons::WARMUP_NOT_FOUND),
    )
    .await;
    let status = held.status.clone().unwrap();
    assert_eq!(status.phase, Some(Phase::Pending), "{status:?}");
    let created = condition(&held, RESOURCE_CREATED).unwrap();
    assert_eq!(
        (created.status.as_str(), created.reason.as_str()),
        ("False", reasons::WARMUP_NOT_FOUND)
    );
    let images = status.provider.unwrap().images.unwrap();
    assert!(
        images.iter().any(|i| i.starts_with("vllm/vllm-openai")),
        "the provider's default vLLM image: {images:?}"
    );
    assert!(deployments.get_opt("qwen").await.unwrap().is_none());

    // The Warmup names no images: it preloads those the provider reports.
    create_warmup(
        &client,
        &ns,
        "qwen-warm",
        json!({"targetModelDeployment": {"name": "qwen"}}),
    )
    .await
    .unwrap();
    let s = status_where(&client, &ns, "qwen-warm", "InProgress", |s| {
        s.phase == Some(WarmupPhase::InProgress) && s.active_nodes == 1
    })
    .await;
    assert_eq!(s.images, images, "the images the provider renders");
    // The controller writes InProgress before it creates the pod.
    let pods = eventually(60, "the warmup pod", || async {
        let pods = warmup_pods(&client, &ns).await;
        (!pods.is_empty()).then_some(pods)
    })
    .await
    .unwrap();
    let preloaded: Vec<String> = pods[0]
        .spec
        .as_ref()
        .unwrap()
        .init_containers
        .iter()
        .flatten()
        .filter_map(|c| c.image.clone())
        .collect();
    assert!(
        images.iter().all(|i| preloaded.contains(i)),
        "{preloaded:?}"
    );
    // Held, saying why: until the warmup controller writes its first phase the message
    // says the phase is not set yet, then that the Warmup is in progress.
    let held = md_where(
        &client,
        &ns,
        "qwen",
        "WarmedUp=False, AwaitingWarmup, InProgress",
        |m| {
            condition(m, WARMED_UP).is_some_and(|c| {
                c.reason == reasons::AWAITING_WARMUP && c.message.contains("InProgress")
            })
        },
    )
    .await;
    let why = &condition(&held, WARMED_UP).unwrap().message;
    assert!(
        why.contains("qwen-warm") && why.contains("InProgress"),
        "{why}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        deployments.get_opt("qwen").await.unwrap().is_none(),
        "nothing is created while the warmup runs"
    );

    // The kubelet lets the warmup pod finish: the Warmup completes, the gate opens.
    release.store(true, Ordering::SeqCst);
    status_where(&client, &ns, "qwen-warm", "Completed", |s| {
        s.phase == Some(WarmupPhase::Completed)
    })
    .await;
    let open = md_where(&client, &ns, "qwen", "WarmedUp=True", |m| {
        condition(m, WARMED_UP).is_some_and(|c| c.status == "True")
            && condition(m, RESOURCE_CREATED).is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(
        condition(&open, WARMED_UP).unwrap().reason,
        reasons::WARMUP_COMPLETED
    );
    let deployment = deployments.get("qwen").await.unwrap();
    assert_eq!(deployment.spec.replicas, Some(2), "at full scale");

    // Deleting the Warmup takes nothing back.
    let api: Api<Warmup> = Api::namespaced(client.clone(), &ns);
    api.delete("qwen-warm", &DeleteParams::default())
        .await
        .unwrap();
    let after = md_where(&client, &ns, "qwen", "still open", |m| {
        condition(m, WARMED_UP).is_some_and(|c| c.reason == reasons::ALREADY_CREATED)
    })
    .await;
    assert_eq!(condition(&after, WARMED_UP).unwrap().status, "True");
    assert!(deployments.get_opt("qwen").await.unwrap().is_some());
}

/// A ModelDeployment that runs already, under `spec.warmup`: a scale-up is not applied
/// (the Deployment keeps its replicas) until the Warmup completes; an upgrade to an image
/// the completed Warmup did not preload waits as `WarmupOutdated` until a Warmup of that
/// name preloads it; a scale-down waits for nothing. Served by the SDK's example
/// Deployment provider, in-process, with the test playing the kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_up_and_an_upgrade_wait_for_a_warmup_that_covers_them() {
    use k8s_openapi::api::apps::v1::Deployment;
    use kubeairunway_sdk::ModelDeployment;
    use kubeairunway_sdk::api::EngineType;
    use kubeairunway_sdk::conditions::{RESOURCE_CREATED, WARMED_UP, reasons};
    use kubeairunway_sdk::testing::{self, ModelDeploymentBuilder, condition, md_where};
    use std::sync::atomic::{AtomicBool, Ordering};

    let Some((cluster, client, _controller)) = start("warmup-scale").await else {
        return;
    };
    let ns = cluster.namespace("warmup-scale");
    gpu_node(&client, "h100-1", json!({"pool": "h100"}), 8, json!([])).await;
    let release = Arc::new(AtomicBool::new(false));
    let _kubelet = Kubelet::start(client.clone(), &ns, {
        let release = release.clone();
        move |_, _| {
            if release.load(Ordering::SeqCst) {
                Run::Succeed
            } else {
                Run::Hang
            }
        }
    });
    let provider = "gate-scale-e2e";
    let _running = testing::spawn(
        kubeairunway_deployment_provider::DeploymentProvider::named(provider),
        client.clone(),
        testing::test_options(),
    );
    let (old_image, new_image) = ("vllm/vllm-openai:v0.10.0", "vllm/vllm-openai:v0.11.0");
    let md = ModelDeploymentBuilder::new("qwen")
        .namespace(&ns)
        .model("Qwen/Qwen3-0.6B")
        .engine(EngineType::Vllm)
        .image(old_image)
        .gpus(1)
        .replicas(1)
        .provider(provider)
        .build();
    testing::deploy(&client, &md, provider).await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    let deployment = || async {
        let d = deployments.get("qwen").await.unwrap();
        let spec = d.spec;
        let image = spec.template.spec.unwrap().containers[0].image.clone();
        (spec.replicas, image.unwrap_or_default())
    };
    eventually(60, "the Deployment at 1 replica", || async {
        deployments.get_opt("qwen").await.ok().flatten()
    })
    .await
    .unwrap();
    assert_eq!(deployment().await, (Some(1), old_image.to_string()));
    let patch = |spec: Value| {
        let mds = mds.clone();
        async move {
            mds.patch(
                "qwen",
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": spec })),
            )
            .await
            .unwrap();
        }
    };

    // spec.warmup named and 2 replicas asked, with no Warmup of that name: the scale-up
    // waits, the Deployment stays as it is, the ModelDeployment still reports it.
    patch(json!({"warmup": {"name": "qwen-warm"}, "scaling": {"replicas": 2}})).await;
    let held = md_where(&client, &ns, "qwen", "scale-up held", |m| {
        m.status.as_ref().and_then(|s| s.observed_generation) == m.metadata.generation
            && condition(m, WARMED_UP)
                .is_some_and(|c| c.status == "False" && c.reason == reasons::WARMUP_NOT_FOUND)
    })
    .await;
    let why = &condition(&held, WARMED_UP).unwrap().message;
    assert!(
        why.contains("the scale-up (replicas 1 to 2) is not applied"),
        "{why}"
    );
    assert_eq!(
        condition(&held, RESOURCE_CREATED).unwrap().status,
        "True",
        "the live Deployment is still reported"
    );
    assert_eq!(deployment().await, (Some(1), old_image.to_string()));

    // The Warmup runs: still held; it completes: the scale-up is applied.
    create_warmup(
        &client,
        &ns,
        "qwen-warm",
        json!({"targetModelDeployment": {"name": "qwen"}}),
    )
    .await
    .unwrap();
    status_where(&client, &ns, "qwen-warm", "InProgress", |s| {
        s.phase == Some(WarmupPhase::InProgress)
    })
    .await;
    md_where(&client, &ns, "qwen", "AwaitingWarmup", |m| {
        condition(m, WARMED_UP).is_some_and(|c| c.reason == reasons::AWAITING_WARMUP)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        deployment().await,
        (Some(1), old_image.to_string()),
        "not scaled up while the warmup runs"
    );
    release.store(true, Ordering::SeqCst);
    let done = status_where(&client, &ns, "qwen-warm", "Completed", |s| {
        s.phase == Some(WarmupPhase::Completed)
    })
    .await;
    assert_eq!(done.images, [old_image]);
    md_where(&client, &ns, "qwen", "WarmedUp=True", |m| {
        condition(m, WARMED_UP)
            .is_some_and(|c| c.status == "True" && c.reason == reasons::WARMUP_COMPLETED)
    })
    .await;
    eventually(60, "scaled up to 2", || async {
        (deployment().await.0 == Some(2)).then_some(())
    })
    .await
    .unwrap();

    // An upgrade: the completed Warmup preloaded the old image only.
    patch(json!({"image": new_image})).await;
    let outdated = md_where(&client, &ns, "qwen", "WarmupOutdated", |m| {
        m.status.as_ref().and_then(|s| s.observed_generation) == m.metadata.generation
            && condition(m, WARMED_UP).is_some_and(|c| c.reason == reasons::WARMUP_OUTDATED)
    })
    .await;
    let why = &condition(&outdated, WARMED_UP).unwrap().message;
    assert!(
        why.contains(&format!("the upgrade to {new_image}")),
        "{why}"
    );
    let reported = outdated.status.unwrap().provider.unwrap().images.unwrap();
    assert_eq!(reported, [new_image], "the images to preload are reported");
    assert_eq!(deployment().await, (Some(2), old_image.to_string()));

    // A scale-down brings nothing new onto a node, but the upgrade still waits with it.
    patch(json!({"scaling": {"replicas": 1}})).await;
    md_where(&client, &ns, "qwen", "still outdated", |m| {
        m.status.as_ref().and_then(|s| s.observed_generation) == m.metadata.generation
            && condition(m, WARMED_UP).is_some_and(|c| c.reason == reasons::WARMUP_OUTDATED)
    })
    .await;
    assert_eq!(deployment().await, (Some(2), old_image.to_string()));

    // A Warmup of that name made again preloads the new image: the upgrade is applied.
    let warmups: Api<Warmup> = Api::namespaced(client.clone(), &ns);
    warmups
        .delete("qwen-warm", &DeleteParams::default())
        .await
        .unwrap();
    eventually(60, "the old Warmup gone", || async {
        warmups
            .get_opt("qwen-warm")
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await
    .unwrap();
    create_warmup(
        &client,
        &ns,
        "qwen-warm",
        json!({"targetModelDeployment": {"name": "qwen"}}),
    )
    .await
    .unwrap();
    let done = status_where(&client, &ns, "qwen-warm", "Completed again", |s| {
        s.phase == Some(WarmupPhase::Completed)
    })
    .await;
    assert_eq!(done.images, [new_image]);
    eventually(60, "upgraded and scaled down", || async {
        (deployment().await == (Some(1), new_image.to_string())).then_some(())
    })
    .await
    .unwrap();
    md_where(&client, &ns, "qwen", "WarmedUp=True", |m| {
        condition(m, WARMED_UP)
            .is_some_and(|c| c.status == "True" && c.reason == reasons::WARMUP_COMPLETED)
    })
    .await;
}

/// An inline `spec.warmup`: the provider runtime (here the SDK's example Deployment
/// provider, in-process) makes a Warmup named after the ModelDeployment, owned by it and
/// targeting it, and holds the creation until that Warmup completes; an upgrade to a new
/// image deletes it and makes it again (a Warmup runs once), and is held until the new
/// one, which preloads the new image, completes; deleting the ModelDeployment deletes its
/// Warmup. The test plays the kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_warmup_is_made_held_on_made_again_for_an_upgrade_and_goes_with_its_model() {
    use k8s_openapi::api::apps::v1::Deployment;
    use kubeairunway_sdk::ModelDeployment;
    use kubeairunway_sdk::api::{DeploymentWarmup, EngineType, WarmupPolicies};
    use kubeairunway_sdk::conditions::{WARMED_UP, reasons};
    use kubeairunway_sdk::testing::{self, ModelDeploymentBuilder, condition, md_where};
    use std::sync::atomic::{AtomicBool, Ordering};

    let Some((cluster, client, _controller)) = start("warmup-inline").await else {
        return;
    };
    let ns = cluster.namespace("warmup-inline");
    gpu_node(&client, "h100-1", json!({"pool": "h100"}), 8, json!([])).await;
    let release = Arc::new(AtomicBool::new(false));
    let _kubelet = Kubelet::start(client.clone(), &ns, {
        let release = release.clone();
        move |_, _| {
            if release.load(Ordering::SeqCst) {
                Run::Succeed
            } else {
                Run::Hang
            }
        }
    });
    let provider = "gate-inline-e2e";
    let _running = testing::spawn(
        kubeairunway_deployment_provider::DeploymentProvider::named(provider),
        client.clone(),
        testing::test_options(),
    );
    let (old_image, new_image) = ("vllm/vllm-openai:v0.10.0", "vllm/vllm-openai:v0.11.0");
    let md = ModelDeploymentBuilder::new("qwen")
        .namespace(&ns)
        .model("Qwen/Qwen3-0.6B")
        .engine(EngineType::Vllm)
        .image(old_image)
        .gpus(1)
        .replicas(1)
        .provider(provider)
        .spec(|s| {
            s.warmup = Some(DeploymentWarmup {
                policies: Some(WarmupPolicies {
                    parallelism: Some(1),
                    ..WarmupPolicies::default()
                }),
                ..DeploymentWarmup::default()
            });
        })
        .build();
    testing::deploy(&client, &md, provider).await.unwrap();
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    let uid = mds.get("qwen").await.unwrap().metadata.uid.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let warmups: Api<Warmup> = Api::namespaced(client.clone(), &ns);

    // The Warmup made from the inline fields: owned by the ModelDeployment, targeting it.
    let made = eventually(60, "the Warmup made", || async {
        warmups.get_opt("qwen").await.ok().flatten()
    })
    .await
    .unwrap();
    let owner = &made.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("ModelDeployment", uid.as_str(), Some(true))
    );
    assert_eq!(
        made.spec.target_model_deployment.as_ref().unwrap().name,
        "qwen"
    );
    assert_eq!(made.spec.policies.as_ref().unwrap().parallelism, Some(1));
    let first = status_where(&client, &ns, "qwen", "InProgress", |s| {
        s.phase == Some(WarmupPhase::InProgress)
    })
    .await;
    assert_eq!(first.images, [old_image], "the images the provider renders");
    let held = md_where(&client, &ns, "qwen", "AwaitingWarmup", |m| {
        condition(m, WARMED_UP).is_some_and(|c| c.reason == reasons::AWAITING_WARMUP)
    })
    .await;
    let why = &condition(&held, WARMED_UP).unwrap().message;
    assert!(why.contains("'qwen'"), "{why}");
    assert!(deployments.get_opt("qwen").await.unwrap().is_none());

    // The kubelet lets the warmup pod finish: the Warmup completes, the gate opens.
    release.store(true, Ordering::SeqCst);
    md_where(&client, &ns, "qwen", "WarmedUp=True", |m| {
        condition(m, WARMED_UP)
            .is_some_and(|c| c.status == "True" && c.reason == reasons::WARMUP_COMPLETED)
    })
    .await;
    let image = || async {
        let d = deployments.get_opt("qwen").await.ok().flatten()?;
        d.spec.template.spec?.containers.first()?.image.clone()
    };
    eventually(60, "the Deployment created", || async {
        image().await.filter(|i| i == old_image)
    })
    .await
    .unwrap();

    // An upgrade: the Warmup preloaded the old image only; it is made again.
    release.store(false, Ordering::SeqCst);
    mds.patch(
        "qwen",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"image": new_image}})),
    )
    .await
    .unwrap();
    let again = eventually(60, "the Warmup made again", || async {
        let w = warmups.get_opt("qwen").await.ok().flatten()?;
        (w.metadata.uid != made.metadata.uid).then_some(w)
    })
    .await
    .unwrap();
    assert_eq!(again.spec, made.spec, "the same inline fields");
    let second = status_where(&client, &ns, "qwen", "InProgress again", |s| {
        s.phase == Some(WarmupPhase::InProgress)
    })
    .await;
    assert_eq!(second.images, [new_image]);
    md_where(&client, &ns, "qwen", "the upgrade held", |m| {
        m.status.as_ref().and_then(|s| s.observed_generation) == m.metadata.generation
            && condition(m, WARMED_UP).is_some_and(|c| c.status == "False")
    })
    .await;
    assert_eq!(
        image().await.as_deref(),
        Some(old_image),
        "not upgraded yet"
    );
    release.store(true, Ordering::SeqCst);
    eventually(60, "upgraded", || async {
        image().await.filter(|i| i == new_image)
    })
    .await
    .unwrap();

    // Deleting the ModelDeployment deletes its Warmup (the garbage collector would too,
    // through the owner reference; this API server runs none).
    mds.delete("qwen", &DeleteParams::default()).await.unwrap();
    eventually(60, "the Warmup deleted", || async {
        warmups
            .get_opt("qwen")
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await
    .unwrap();
    eventually(60, "the ModelDeployment gone", || async {
        mds.get_opt("qwen").await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();
}

/// Whoever may write a Warmup cannot make the warmup controller run a pod that owns its
/// node: a custom action asking for the node's namespaces, a privileged container, the
/// node's disk, another service account or the platform's own labels fails the Warmup
/// naming each rule, and no pod is created. And a pod that only carries the warmup-uid
/// label (anyone's pod can) is never taken for an orphaned warmup pod and deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_action_that_would_own_its_node_is_refused_and_others_pods_are_never_swept() {
    let Some((cluster, client, _controller)) = start("warmup-policy").await else {
        return;
    };
    node(&client, "gpu-1", json!({"pool": "a100"})).await;
    let ns = cluster.namespace("warmup-policy");
    create_warmup(
        &client,
        &ns,
        "root",
        json!({
            "targetNodes": {"nodeNames": ["gpu-1"]},
            "customAction": {"podTemplate": {
                "metadata": {"labels": {"kubeairunway.ai/model-deployment": "other"}},
                "spec": {
                    "hostPID": true,
                    "serviceAccountName": "admin",
                    "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                    "containers": [{"name": "c", "image": "busybox:1.36",
                                    "securityContext": {"privileged": true}}],
                },
            }},
        }),
    )
    .await
    .unwrap();
    let s = status_where(&client, &ns, "root", "Failed", |s| {
        s.phase == Some(WarmupPhase::Failed)
    })
    .await;
    let failed = s.conditions.iter().find(|c| c.type_ == "Failed").unwrap();
    assert_eq!(failed.reason, "InvalidSpec", "{s:?}");
    for rule in [
        "metadata.labels[kubeairunway.ai/model-deployment]",
        "spec.serviceAccountName: admin",
        "spec.hostPID",
        "spec.volumes[0].hostPath: /",
        "spec.containers[0].securityContext.privileged",
    ] {
        assert!(
            failed.message.contains(rule),
            "{rule} in {}",
            failed.message
        );
    }
    assert!(warmup_pods(&client, &ns).await.is_empty());

    // A pod of someone else's that carries the warmup-uid label of no Warmup: not ours
    // (no Warmup owner, no managed-by), so the sweep leaves it alone.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let theirs: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "serving", "labels": {warmup::pod::WARMUP_UID_LABEL: "no-such-warmup"}},
        "spec": {"containers": [{"name": "c", "image": "vllm/vllm-openai:v0.11.0"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &theirs).await.unwrap();
    // A Warmup created and deleted after it: the controller has seen the pod by then.
    create_warmup(
        &client,
        &ns,
        "later",
        json!({"targetNodes": {"nodeNames": ["gpu-1"]}, "imagesPreload": {"items": ["busybox:1.36"]}}),
    )
    .await
    .unwrap();
    eventually(30, "the later Warmup's pod", || async {
        (warmup_pods(&client, &ns).await.len() == 2).then_some(())
    })
    .await
    .unwrap();
    Api::<Warmup>::namespaced(client.clone(), &ns)
        .delete("later", &DeleteParams::default())
        .await
        .unwrap();
    eventually(30, "the later Warmup's pod deleted with it", || async {
        (warmup_pods(&client, &ns).await.len() == 1).then_some(())
    })
    .await
    .unwrap();
    let left = warmup_pods(&client, &ns).await;
    assert_eq!(
        left[0].metadata.name.as_deref(),
        Some("serving"),
        "{left:?}"
    );
}

/// RBAC lets the warmup controller create and delete pods in every namespace; the chart's
/// warmup-pods policy keeps that to its own pods. As its service account: a pod without
/// the managed-by label, one not controlled by a Warmup, one in kube-system and deleting
/// someone else's pod are refused (422); a warmup pod in a user's namespace is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warmup_controller_may_create_and_delete_only_its_own_pods_outside_system_namespaces() {
    let Some((cluster, client, controller)) = start("warmup-fence").await else {
        return;
    };
    let ns = cluster.namespace("warmup-fence");
    kubeairunway_testcluster::ensure_namespace(&client, "kube-system")
        .await
        .unwrap();
    let as_warmup = controller.identity.client(&cluster).await.unwrap();
    let pods = |ns: &str| Api::<Pod>::namespaced(as_warmup.clone(), ns);
    let labels = json!({warmup::pod::MANAGED_BY_LABEL: warmup::pod::MANAGED_BY,
                        warmup::pod::WARMUP_UID_LABEL: "uid-1"});
    let owner = |kind: &str, controller: bool| {
        json!([{"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": kind, "name": "w",
                "uid": "uid-1", "controller": controller}])
    };
    let ours = probe_pod(&labels, &owner("Warmup", true));
    let pp = PostParams::default();
    let unlabelled = "the warmup controller touches only pods labelled app.kubernetes.io/managed-by=kernelcache-warmup";
    let unowned = "the warmup controller's pods are controlled by a Warmup (cache.kubeairunway.ai)";
    policy::assert_denied(
        &pods(&ns)
            .create(&pp, &probe_pod(&json!({}), &owner("Warmup", true)))
            .await,
        PODS_POLICY,
        unlabelled,
    );
    policy::assert_denied(
        &pods(&ns)
            .create(
                &pp,
                &probe_pod(
                    &json!({"app.kubernetes.io/managed-by": "helm"}),
                    &owner("Warmup", true),
                ),
            )
            .await,
        PODS_POLICY,
        unlabelled,
    );
    for owners in [json!([]), owner("ReplicaSet", true), owner("Warmup", false)] {
        policy::assert_denied(
            &pods(&ns).create(&pp, &probe_pod(&labels, &owners)).await,
            PODS_POLICY,
            unowned,
        );
    }
    for system in ["kube-system", CHART_NAMESPACE] {
        policy::assert_denied(
            &pods(system).create(&pp, &ours).await,
            PODS_POLICY,
            "the warmup controller never touches pods in kube-system, kube-public, kube-node-lease or its own namespace",
        );
    }
    // A warmup pod in a user's namespace is admitted (a dry run).
    pods(&ns).create(&dry_run(), &ours).await.unwrap();
    // Someone else's pod in a user's namespace: not the controller's to delete.
    let theirs = probe_pod(&json!({"app": "serving"}), &json!([]));
    Api::<Pod>::namespaced(client.clone(), &ns)
        .create(&pp, &theirs)
        .await
        .unwrap();
    policy::assert_denied(
        &pods(&ns).delete("probe", &DeleteParams::default()).await,
        PODS_POLICY,
        unlabelled,
    );
    Api::<Pod>::namespaced(client.clone(), &ns)
        .get("probe")
        .await
        .unwrap();
}
