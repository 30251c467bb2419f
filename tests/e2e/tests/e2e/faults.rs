//! Faults during a rollout, with core and the Dynamo provider as processes of their own
//! (`e2e-controller`, run as their binaries run them, leader election on):
//! - SIGKILL of either controller at moments spread over a 200-ModelDeployment rollout,
//!   each restarted at once under a new identity (so it must wait for the dead one's
//!   Lease to expire, as a new pod would): at the end every ModelDeployment has exactly
//!   one DynamoGraphDeployment, owned by it, and a converged status, and there is no
//!   orphan;
//! - the API server unreachable for 20 s mid-rollout (a proxy between the controllers and
//!   the API server cuts every connection and refuses new ones): the controllers back
//!   off, bounded connection attempts while it is away, and converge after it returns,
//!   including on ModelDeployments created while they could not see them;
//! - a burst of ModelDeployments waiting for controllers that start after it (each
//!   controller behind a proxy of its own): neither holds more connections at once than
//!   its reconcile concurrency cap and its long-lived watches and Lease allow.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_e2e::outage::Outage;
use kubeairunway_e2e::{fixtures_dir, read_crd};
use kubeairunway_sdk::api::{EngineType, ModelDeployment};
use kubeairunway_sdk::conditions::{PROVIDER_SELECTED, RESOURCE_CREATED};
use kubeairunway_sdk::testing::{self, ModelDeploymentBuilder, TestCluster, condition};

const DGD_CRD: &str = "nvidia.com_dynamographdeployments.yaml";
const LEASE_NAMESPACE: &str = "faults-system";
const CONVERGE: Duration = Duration::from_secs(300);

fn dgds(client: &Client, ns: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "nvidia.com".into(),
        version: "v1beta1".into(),
        api_version: "nvidia.com/v1beta1".into(),
        kind: "DynamoGraphDeployment".into(),
        plural: "dynamographdeployments".into(),
    };
    Api::namespaced_with(client.clone(), ns, &resource)
}

/// A controller process; killed (SIGKILL) when dropped.
struct Controller {
    role: &'static str,
    child: Child,
    log: PathBuf,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Controller {
    /// Start `role` (`core` or `dynamo`) against `kubeconfig`, as pod `incarnation`.
    fn start(role: &'static str, kubeconfig: &Path, dir: &Path, incarnation: usize) -> Self {
        let log = dir.join(format!("{role}-{incarnation}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_e2e-controller"));
        cmd.arg(role)
            .env("KUBECONFIG", kubeconfig)
            .env("METRICS_BIND_ADDRESS", "127.0.0.1:0")
            .env("LEADER_ELECT", "true")
            .env("LEADER_ELECT_LEASE_DURATION", "4s")
            .env("LEADER_ELECT_RENEW_DEADLINE", "3s")
            .env("LEADER_ELECT_RETRY_PERIOD", "1s")
            .env("POD_NAMESPACE", LEASE_NAMESPACE)
            .env("POD_NAME", format!("{role}-{incarnation}"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        if role == "core" {
            cmd.env("ENABLE_WEBHOOKS", "false");
        }
        Self {
            role,
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    /// Still running, or the tail of its log.
    fn check_alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            panic!(
                "{} exited ({status}):\n{}",
                self.role,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

async fn cluster(tag: &str) -> (TestCluster, Client) {
    let crd = read_crd(&fixtures_dir().join("crds/upstream").join(DGD_CRD)).unwrap();
    let (cluster, client) = testing::private_cluster(tag, &[crd]).await.unwrap();
    for ns in [LEASE_NAMESPACE, "faults"] {
        kubeairunway_testcluster::ensure_namespace(&client, ns)
            .await
            .unwrap();
    }
    (cluster, client)
}

fn vllm(i: usize) -> ModelDeployment {
    ModelDeploymentBuilder::new(&format!("md-{i}"))
        .namespace("faults")
        .model("Qwen/Qwen3-0.6B")
        .engine(EngineType::Vllm)
        .gpus(1)
        .build()
}

/// Create ModelDeployments `range` over four connections.
async fn create(cluster: &TestCluster, range: std::ops::Range<usize>) {
    let mut tasks = tokio::task::JoinSet::new();
    let ids: Vec<usize> = range.collect();
    for chunk in ids.chunks(ids.len().div_ceil(4).max(1)) {
        let client = cluster.client().await.unwrap();
        let chunk = chunk.to_vec();
        tasks.spawn(async move {
            let mds: Api<ModelDeployment> = Api::namespaced(client, "faults");
            for i in chunk {
                mds.create(&PostParams::default(), &vllm(i)).await.unwrap();
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
}

/// What is wrong with the end state of `n` ModelDeployments, if anything: each has
/// exactly one DynamoGraphDeployment, owned by it, named in its status; its status
/// converged (selected, resource created, observed generation current); the provider's
/// finalizer on it; no orphan.
async fn end_state_problems(client: &Client, n: usize) -> Vec<String> {
    let mds: Vec<ModelDeployment> = Api::<ModelDeployment>::namespaced(client.clone(), "faults")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let objects = dgds(client, "faults")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut problems = Vec::new();
    if mds.len() != n {
        problems.push(format!("{} ModelDeployments, expected {n}", mds.len()));
    }
    let by_uid: BTreeMap<String, &ModelDeployment> =
        mds.iter().map(|m| (m.uid().unwrap(), m)).collect();
    let mut owned: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for o in &objects {
        let owners: Vec<_> = o
            .owner_references()
            .iter()
            .filter(|r| r.controller == Some(true))
            .collect();
        match owners.as_slice() {
            [owner] if by_uid.contains_key(&owner.uid) => {
                owned
                    .entry(owner.uid.clone())
                    .or_default()
                    .push(o.name_any());
            }
            _ => problems.push(format!(
                "orphan or foreign DynamoGraphDeployment {}",
                o.name_any()
            )),
        }
    }
    for md in &mds {
        let name = md.name_any();
        let objects = owned.get(&md.uid().unwrap()).cloned().unwrap_or_default();
        if objects.len() != 1 {
            problems.push(format!("{name} owns {objects:?}"));
            continue;
        }
        let status = md.status.clone().unwrap_or_default();
        let provider = status.provider.unwrap_or_default();
        if provider.name.as_deref() != Some("dynamo")
            || provider.resource_name.as_ref() != objects.first()
        {
            problems.push(format!(
                "{name}: status.provider {:?} {:?}",
                provider.name, provider.resource_name
            ));
        }
        for cond in [PROVIDER_SELECTED, RESOURCE_CREATED] {
            if condition(md, cond).map(|c| c.status.as_str()) != Some("True") {
                problems.push(format!(
                    "{name}: {cond} is {:?}",
                    condition(md, cond).map(|c| &c.status)
                ));
            }
        }
        // Core's webhooks are off here, as when they are down or bypassed: the provider
        // adds its finalizer itself.
        if md.finalizers() != ["kubeairunway.ai/dynamo-provider"] {
            problems.push(format!("{name}: finalizers {:?}", md.finalizers()));
        }
        if status.observed_generation != md.metadata.generation {
            problems.push(format!(
                "{name}: observedGeneration {:?} of {:?}",
                status.observed_generation, md.metadata.generation
            ));
        }
    }
    problems
}

/// Wait until the end state has no problem, keeping `controllers` alive.
/// The controller logs in `dir` (every incarnation's) that say a leader term's work had
/// to be cancelled because it did not stop when its term ended: each is a wait that
/// ignores the term (a replica that would otherwise stay stuck in a term it lost).
fn cancelled_terms(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .filter_map(|p| {
            let log = std::fs::read_to_string(&p).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let at = lines
                .iter()
                .position(|l| l.contains(kubeairunway_sdk::process::TERM_CANCELLED))?;
            // What the process did up to then names the wait that ignored the term.
            let before = lines[at.saturating_sub(15)..=at].join("\n");
            Some(format!("{}:\n{before}", p.display()))
        })
        .collect()
}

async fn converge(client: &Client, n: usize, controllers: &mut [Controller]) -> Duration {
    let started = Instant::now();
    loop {
        for c in controllers.iter_mut() {
            c.check_alive();
        }
        let problems = end_state_problems(client, n).await;
        if problems.is_empty() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < CONVERGE,
            "not converged after {CONVERGE:?}: {} problems, first: {:?}",
            problems.len(),
            &problems[..problems.len().min(10)]
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controllers_killed_mid_rollout_converge_to_one_owned_object_each() {
    const N: usize = 200;
    let (cluster, client) = cluster("faults-kill").await;
    let dir = cluster.dir().to_path_buf();
    let kubeconfig = cluster.kubeconfig().to_path_buf();
    let mut incarnation = 0;
    let mut controllers = vec![
        Controller::start("core", &kubeconfig, &dir, incarnation),
        Controller::start("dynamo", &kubeconfig, &dir, incarnation),
    ];
    let creator = cluster.client().await.unwrap();
    let rollout = tokio::spawn(async move {
        let mds: Api<ModelDeployment> = Api::namespaced(creator, "faults");
        for i in 0..N {
            mds.create(&PostParams::default(), &vllm(i)).await.unwrap();
            if i % 20 == 19 {
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        }
    });
    // Kill one controller or the other at spread-out moments of the rollout (a fixed
    // pseudo-random sequence, so a failure can be replayed), restarting it at once.
    let mut seed: u64 = 0x5eed_fa17;
    let mut kills = Vec::new();
    for _ in 0..6 {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let wait = Duration::from_millis(500 + (seed >> 33) % 2500);
        tokio::time::sleep(wait).await;
        let victim = usize::from(seed >> 63 == 1);
        incarnation += 1;
        let role = controllers[victim].role;
        controllers[victim].check_alive();
        controllers[victim].child.kill().unwrap(); // SIGKILL
        controllers[victim].child.wait().unwrap();
        controllers[victim] = Controller::start(role, &kubeconfig, &dir, incarnation);
        kills.push(role);
    }
    rollout.await.unwrap();
    let took = converge(&client, N, &mut controllers).await;
    println!(
        "killed {kills:?}; converged {:.1} s after the last create",
        took.as_secs_f64()
    );
    // Stays converged: nothing flaps once it has settled.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(end_state_problems(&client, N).await, Vec::<String>::new());
    assert_eq!(cancelled_terms(&dir), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_api_server_is_waited_out_with_backoff_and_then_converged() {
    const N: usize = 60;
    const AWAY: Duration = Duration::from_secs(20);
    let (cluster, client) = cluster("faults-outage").await;
    let dir = cluster.dir().to_path_buf();
    let outage = Outage::start(cluster.server()).await.unwrap();
    let kubeconfig = dir.join("kubeconfig-via-proxy");
    outage
        .kubeconfig(cluster.kubeconfig(), cluster.server(), &kubeconfig)
        .unwrap();
    let mut controllers = vec![
        Controller::start("core", &kubeconfig, &dir, 0),
        Controller::start("dynamo", &kubeconfig, &dir, 0),
    ];
    create(&cluster, 0..N / 2).await;
    // Mid-rollout: some deployed, some not yet.
    outage.set_down(true);
    // Work arrives while the controllers cannot see it.
    create(&cluster, N / 2..N).await;
    tokio::time::sleep(AWAY).await;
    outage.set_down(false);
    let attempts = outage.attempts_while_down();
    let took = converge(&client, N, &mut controllers).await;
    println!(
        "{attempts} connection attempts in {} s away; converged {:.1} s after the API server returned",
        AWAY.as_secs(),
        took.as_secs_f64()
    );
    // Two controllers, each with a handful of watches, a Lease and requeued work: with
    // backoff that is a few attempts per second at most; a retry loop without backoff
    // makes thousands.
    let bound = 10 * usize::try_from(AWAY.as_secs()).unwrap();
    assert!(
        attempts > 0,
        "the controllers never noticed the outage: the proxy is not in the path"
    );
    assert!(
        attempts <= bound,
        "{attempts} connection attempts in {AWAY:?}: a retry loop without backoff"
    );
    let ids: BTreeSet<String> = end_state_problems(&client, N).await.into_iter().collect();
    assert!(ids.is_empty(), "{ids:?}");
    assert_eq!(cancelled_terms(&dir), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_is_reconciled_over_a_bounded_number_of_connections() {
    use kubeairunway_sdk::process::RECONCILE_CONCURRENCY;
    const N: usize = 200;
    // Besides one request per running reconcile: each controller's watches (core: about
    // 12: ModelDeployments, InferenceProviderConfigs, CRDs and the gateway's eight kinds
    // and Gateways; the provider: about 8 with the owned kinds), its Lease, the provider's
    // heartbeat and event writes, and a connection or two being replaced.
    const LONG_LIVED: usize = 24;
    let bound = usize::from(RECONCILE_CONCURRENCY) + LONG_LIVED;
    // Uncapped, the same burst held 280 connections in core and 97 in the provider.
    assert!(
        bound < N / 2,
        "a burst of {N} does not test a cap of {RECONCILE_CONCURRENCY}"
    );
    let (cluster, client) = cluster("faults-burst").await;
    let dir = cluster.dir().to_path_buf();
    // The whole burst is there before the controllers start: their first list queues
    // every ModelDeployment at once.
    create(&cluster, 0..N).await;
    let mut proxies = Vec::new();
    let mut controllers = Vec::new();
    for role in ["core", "dynamo"] {
        let proxy = Outage::start(cluster.server()).await.unwrap();
        let kubeconfig = dir.join(format!("kubeconfig-{role}-via-proxy"));
        proxy
            .kubeconfig(cluster.kubeconfig(), cluster.server(), &kubeconfig)
            .unwrap();
        controllers.push(Controller::start(role, &kubeconfig, &dir, 0));
        proxies.push((role, proxy));
    }
    converge(&client, N, &mut controllers).await;
    for (role, proxy) in &proxies {
        let most = proxy.most_open();
        println!("{role}: at most {most} connections open at once for {N} ModelDeployments");
        assert!(most > 0, "{role} did not go through its proxy");
        assert!(
            most <= bound,
            "{role} had {most} connections open at once (bound {bound}): reconciles are not capped"
        );
    }
    assert_eq!(end_state_problems(&client, N).await, Vec::<String>::new());
}
