//! The KubeRay operator (ray-project/kuberay) as the end-to-end tests play it, in the two
//! releases whose RayService CRDs the tests install: v1.3.0 (the chart version the
//! provider's installation names) and v1.7.0 (the newest release; its CRD is the one in
//! `tests/fixtures/crds/upstream/ray.io_rayservices.yaml`).
//!
//! Everything here is a pure function of the RayService (as JSON) and of what the operator
//! keeps for it ([`Clusters`]: the RayClusters it made and what their Ray Serve reports);
//! the e2e module does the I/O. Paths below are in ray-project/kuberay, `ray-operator/`:
//!
//! - admission ([`webhook`]): the optional RayService webhook checks only the metadata
//!   (`pkg/webhooks/v1/rayservice_webhook.go:49-63@v1.7.0`); v1.3.0 has no RayService
//!   webhook.
//! - validation ([`validate`]): `controllers/ray/utils/validation.go` and where the
//!   controller reports it (v1.7.0: `Ready=False`, reason `ValidationFailed`; v1.3.0: an
//!   event only).
//! - names ([`ray_cluster_name`], [`serve_service_name`]): `controllers/ray/utils/util.go`.
//! - status ([`reconcile`]): `controllers/ray/rayservice_controller.go`, `Reconcile`,
//!   `calculateStatus` and `calculateConditions`: a first deployment's application
//!   statuses go to `pendingServiceStatus` and move to `activeServiceStatus` only when the
//!   Services switch to the new cluster.
//!
//! Not played: the autoscaler, incremental upgrades, suspend, the initializing timeout
//! (only with the `ray.io/initializing-timeout` annotation, never rendered), and the
//! validation of fields no provider renders (auth, TLS, network policy, history server).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// A KubeRay release the stand-in plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KubeRay {
    /// v1.3.0 (`8ba2b33c358ccb515162333ea483263077057b57`).
    V1_3_0,
    /// v1.7.0 (`59d663aeec13760646da3db9c1cf8cfe883e30b7`).
    V1_7_0,
}

impl KubeRay {
    /// The release tag.
    pub fn tag(self) -> &'static str {
        match self {
            KubeRay::V1_3_0 => "v1.3.0",
            KubeRay::V1_7_0 => "v1.7.0",
        }
    }

    /// The RayService CRD of this release in `tests/fixtures/crds/upstream`.
    pub fn crd_file(self) -> &'static str {
        match self {
            KubeRay::V1_3_0 => "ray.io_rayservices.v1.3.0.yaml",
            KubeRay::V1_7_0 => "ray.io_rayservices.yaml",
        }
    }
}

/// The finalizer v1.7.0 puts on every RayService and removes once its RayClusters are
/// gone (`rayservice_controller.go:132-154@v1.7.0`, `utils/constant.go:350@v1.7.0`).
/// v1.3.0 has none.
pub const FINALIZER: &str = "ray.io/rayservice-finalizer";

/// The longest RayService name v1.7.0 accepts: 53 (the longest RayCluster name, so that
/// `<cluster>-serve-svc` fits in 63) minus the 6 characters of the cluster suffix
/// (`utils/constant.go:372-378@v1.7.0`).
pub const MAX_NAME_LENGTH: usize = 47;

/// Where a validation failure surfaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// v1.7.0: `Ready=False`, reason `ValidationFailed`, with this message, and nothing
    /// else is reconciled (`rayservice_controller.go:156-171@v1.7.0`).
    ValidationFailed(String),
    /// v1.3.0, a RayService rule: a warning event, and the status is never written
    /// (`rayservice_controller.go:118-122@v1.3.0`).
    ServiceEvent(String),
    /// v1.3.0, a RayCluster rule: the RayService goes on and creates its cluster, which
    /// the RayCluster controller refuses with an event (`raycluster_controller.go:223-228@v1.3.0`):
    /// its pods never start, the RayService stays `Initializing`.
    ClusterEvent(String),
}

impl Refusal {
    /// The message.
    pub fn message(&self) -> &str {
        match self {
            Refusal::ValidationFailed(m) | Refusal::ServiceEvent(m) | Refusal::ClusterEvent(m) => m,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Names

/// The RayCluster a RayService named `service` creates, with `suffix` standing for
/// KubeRay's 5 random characters: `<name>-raycluster-<5>` (`utils/util.go:312-314` and
/// `RayClusterSuffix`, `util.go:32@v1.3.0`), `<name>-<5>` (`utils/util.go:369-371@v1.7.0`).
pub fn ray_cluster_name(version: KubeRay, service: &str, suffix: &str) -> String {
    match version {
        KubeRay::V1_3_0 => format!("{service}-raycluster-{suffix}"),
        KubeRay::V1_7_0 => format!("{service}-{suffix}"),
    }
}

/// The serve Service of a RayService: `<name>-serve-svc`, which v1.3.0 passes through
/// `CheckName` (`utils/util.go:292-294@v1.3.0`, untruncated in `util.go:349-351@v1.7.0`).
pub fn serve_service_name(version: KubeRay, service: &str) -> String {
    let name = format!("{service}-serve-svc");
    match version {
        KubeRay::V1_3_0 => check_name(&name),
        KubeRay::V1_7_0 => name,
    }
}

/// `CheckName` (`utils/util.go:184-206@v1.3.0`): beyond 50 characters the *front* is cut
/// off, and a leading digit or punctuation becomes `r`.
fn check_name(s: &str) -> String {
    const MAX: usize = 50;
    let mut s = if s.len() > MAX {
        s[s.len() - MAX..].to_string()
    } else {
        s.to_string()
    };
    if s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c.is_ascii_punctuation())
    {
        s.replace_range(0..1, "r");
    }
    s
}

// ---------------------------------------------------------------------------------------
// Admission and validation

/// The optional RayService admission webhook: v1.7.0 refuses what
/// `ValidateRayServiceMetadata` refuses (`pkg/webhooks/v1/rayservice_webhook.go:49-63@v1.7.0`);
/// v1.3.0 has no RayService webhook.
pub fn webhook(version: KubeRay, rs: &Value) -> Result<(), String> {
    match version {
        KubeRay::V1_3_0 => Ok(()),
        KubeRay::V1_7_0 => metadata_rules(rs),
    }
}

/// What the controller checks before it reconciles, and where a failure surfaces.
pub fn validate(version: KubeRay, rs: &Value) -> Result<(), Refusal> {
    let cluster = &rs["spec"]["rayClusterConfig"];
    let annotations = &rs["metadata"]["annotations"];
    match version {
        // `validateRayService` (`rayservice_controller.go:333-350@v1.7.0`): metadata, then
        // `ValidateRayServiceSpec` (`utils/validation.go:680-715@v1.7.0`), which starts with
        // the cluster spec.
        KubeRay::V1_7_0 => metadata_rules(rs)
            .and_then(|()| {
                cluster_rules(version, cluster, annotations)
                    .map_err(|e| format!("The RayService spec is invalid: {e}"))
            })
            .and_then(|()| service_rules(version, rs))
            .map_err(Refusal::ValidationFailed),
        // `ValidateRayServiceSpec` (`utils/validation.go:153-166@v1.3.0`); the cluster spec
        // is checked by the RayCluster controller (`ValidateRayClusterSpec`,
        // `utils/validation.go:23-91@v1.3.0`, on a cluster whose annotations are the
        // RayService's, `rayservice_controller.go:767-770@v1.3.0`).
        KubeRay::V1_3_0 => {
            service_rules(version, rs).map_err(Refusal::ServiceEvent)?;
            cluster_rules(version, cluster, annotations).map_err(Refusal::ClusterEvent)
        }
    }
}

/// `ValidateRayServiceMetadata` (`utils/validation.go:632-646@v1.7.0`).
fn metadata_rules(rs: &Value) -> Result<(), String> {
    let name = rs["metadata"]["name"].as_str().unwrap_or_default();
    if name.len() > MAX_NAME_LENGTH {
        return Err(format!(
            "The RayService metadata is invalid: RayService name should be no more than {MAX_NAME_LENGTH} characters"
        ));
    }
    if !is_dns1035_label(name) {
        return Err(format!(
            "The RayService metadata is invalid: RayService name should be a valid DNS1035 label: [a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')] ({name:?})"
        ));
    }
    // `validateInitializingTimeout` (`utils/validation.go:648-678@v1.7.0`): a positive Go
    // duration or a positive number of seconds.
    let key = INITIALIZING_TIMEOUT;
    if let Some(timeout) = rs["metadata"]["annotations"][key]
        .as_str()
        .filter(|t| !t.is_empty())
    {
        let seconds =
            go_duration_seconds(timeout).or_else(|| timeout.parse::<i32>().ok().map(f64::from));
        match seconds {
            Some(s) if s > 0.0 => {}
            Some(_) => {
                return Err(format!(
                    "The RayService metadata is invalid: RayService annotations is invalid: annotation {key} must be a positive duration, got: {timeout}"
                ));
            }
            None => {
                return Err(format!(
                    "The RayService metadata is invalid: RayService annotations is invalid: annotation {key} has invalid format: {timeout}. Expected Go duration format (e.g., '5m', '1h') or positive integer seconds"
                ));
            }
        }
    }
    Ok(())
}

/// The annotation that bounds a RayService's initialization (`utils/constant.go:82@v1.7.0`).
pub const INITIALIZING_TIMEOUT: &str = "ray.io/initializing-timeout";

/// Go's `time.ParseDuration`, in seconds: `[-+]?(<decimal><unit>)+` or `0`.
fn go_duration_seconds(s: &str) -> Option<f64> {
    let (sign, mut rest) = match s.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0.0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    Some(sign * total)
}

/// Kubernetes' `IsDNS1035Label`.
pub fn is_dns1035_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[bytes.len() - 1] != b'-'
}

/// The RayService's own rules (`utils/validation.go:153-166@v1.3.0`, `:689-705@v1.7.0`).
fn service_rules(version: KubeRay, rs: &Value) -> Result<(), String> {
    let prefix = match version {
        KubeRay::V1_3_0 => "",
        KubeRay::V1_7_0 => "The RayService spec is invalid: ",
    };
    let spec = &rs["spec"];
    if !text(&spec["rayClusterConfig"]["headGroupSpec"]["headService"]["metadata"]["name"])
        .is_empty()
    {
        return Err(format!(
            "{prefix}spec.rayClusterConfig.headGroupSpec.headService.metadata.name should not be set"
        ));
    }
    let allowed: &[&str] = match version {
        KubeRay::V1_3_0 => &["NewCluster", "None"],
        KubeRay::V1_7_0 => &["NewClusterWithIncrementalUpgrade", "NewCluster", "None"],
    };
    if let Some(t) = spec["upgradeStrategy"]["type"].as_str()
        && !allowed.contains(&t)
    {
        return Err(format!(
            "{prefix}Spec.UpgradeStrategy.Type value {t} is invalid, valid options are {}",
            allowed.join(", ")
        ));
    }
    if version == KubeRay::V1_7_0
        && spec["rayClusterDeletionDelaySeconds"]
            .as_i64()
            .is_some_and(|d| d < 0)
    {
        return Err(format!(
            "{prefix}Spec.RayClusterDeletionDelaySeconds should be a non-negative integer"
        ));
    }
    Ok(())
}

/// `ValidateRayClusterSpec` (`utils/validation.go:23-91@v1.3.0`, `:103-327@v1.7.0`), the
/// rules a rendered cluster can meet: containers, replica bounds, `rayStartParams` keys,
/// the head container's environment, suspension.
fn cluster_rules(version: KubeRay, cluster: &Value, annotations: &Value) -> Result<(), String> {
    let head = &cluster["headGroupSpec"];
    if head_container(cluster).is_none() {
        return Err("headGroupSpec should have at least one container".into());
    }
    let autoscaling = cluster["enableInTreeAutoscaling"].as_bool() == Some(true);
    if version == KubeRay::V1_7_0 {
        group_rules("Head", head)?;
    }
    for group in groups(cluster) {
        let name = text(&group["groupName"]);
        if group["template"]["spec"]["containers"]
            .as_array()
            .is_none_or(Vec::is_empty)
        {
            return Err("workerGroupSpec should have at least one container".into());
        }
        if version == KubeRay::V1_7_0 {
            worker_bounds(name, group, autoscaling)?;
            group_rules(name, group)?;
        }
    }
    let ft_annotation = annotations["ray.io/ft-enabled"]
        .as_str()
        .is_some_and(|v| !v.is_empty());
    let ft_options = !cluster["gcsFaultToleranceOptions"].is_null();
    if ft_annotation && ft_options {
        return Err("ray.io/ft-enabled annotation and GcsFaultToleranceOptions are both set. Please use only GcsFaultToleranceOptions to configure GCS fault tolerance".into());
    }
    let ft_enabled = annotations["ray.io/ft-enabled"]
        .as_str()
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || ft_options;
    if !ft_enabled && head_env(cluster, "RAY_REDIS_ADDRESS").is_some() {
        return Err("RAY_REDIS_ADDRESS is set which implicitly enables GCS fault tolerance, but GcsFaultToleranceOptions is not set. Please set GcsFaultToleranceOptions to enable GCS fault tolerance".into());
    }
    let params = &head["rayStartParams"];
    if ft_options && !text(&params["redis-password"]).is_empty() {
        return Err("cannot set `redis-password` in rayStartParams when GcsFaultToleranceOptions is enabled - use GcsFaultToleranceOptions.RedisPassword instead".into());
    }
    if !text(&params["redis-username"]).is_empty() || head_env(cluster, "REDIS_USERNAME").is_some()
    {
        return Err("cannot set redis username in rayStartParams or environment variables - use GcsFaultToleranceOptions.RedisUsername instead".into());
    }
    for group in groups(cluster) {
        if group["suspend"].as_bool() == Some(true) {
            // The RayJobDeletionPolicy feature gate is off by default.
            return Err(format!(
                "worker group {} can be suspended only when the RayJobDeletionPolicy feature gate is enabled",
                text(&group["groupName"])
            ));
        }
    }
    if version == KubeRay::V1_7_0
        && !autoscaling
        && head_env(cluster, "RAY_enable_autoscaler_v2").is_some_and(|v| v == "1" || v == "true")
    {
        return Err("environment variable RAY_enable_autoscaler_v2 cannot be set to 'true' when enableInTreeAutoscaling is false. Please set enableInTreeAutoscaling: true to use autoscaler v2".into());
    }
    Ok(())
}

/// `validateRayGroupResources` and `validateRayGroupLabels` (`utils/validation.go:60-100@v1.7.0`).
fn group_rules(name: &str, group: &Value) -> Result<(), String> {
    let params = &group["rayStartParams"];
    let start_resources = ["num-cpus", "num-gpus", "memory", "resources"]
        .iter()
        .any(|k| !text(&params[*k]).is_empty());
    if start_resources
        && group["resources"]
            .as_object()
            .is_some_and(|r| !r.is_empty())
    {
        return Err(format!(
            "resource fields should not be set in both rayStartParams and Resources for {name} group; please use only one"
        ));
    }
    if params.get("labels").is_some() {
        return Err(format!(
            "rayStartParams['labels'] is not supported for {name} group; please use the top-level Labels field instead"
        ));
    }
    Ok(())
}

/// Replica bounds of a worker group (`utils/validation.go:123-138@v1.7.0`).
fn worker_bounds(name: &str, group: &Value, autoscaling: bool) -> Result<(), String> {
    let (min, max) = (group["minReplicas"].as_i64(), group["maxReplicas"].as_i64());
    if !autoscaling && (min.is_none() || max.is_none()) {
        return Err(format!(
            "worker group {name} must set both minReplicas and maxReplicas when autoscaling is disabled"
        ));
    }
    if let Some(m) = min.filter(|m| *m < 0) {
        return Err(format!("worker group {name} has negative minReplicas {m}"));
    }
    if let Some(m) = max.filter(|m| *m < 0) {
        return Err(format!("worker group {name} has negative maxReplicas {m}"));
    }
    if let (Some(min), Some(max)) = (min, max)
        && min > max
    {
        return Err(format!(
            "worker group {name} has minReplicas {min} greater than maxReplicas {max}"
        ));
    }
    Ok(())
}

fn groups(cluster: &Value) -> impl Iterator<Item = &Value> {
    cluster["workerGroupSpecs"].as_array().into_iter().flatten()
}

/// The Ray container of the head: the first (`RayContainerIndex`).
fn head_container(cluster: &Value) -> Option<&Value> {
    cluster["headGroupSpec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|c| c.first())
}

/// The value of `name` in the head container's env (`""` when it has no plain value).
fn head_env<'a>(cluster: &'a Value, name: &str) -> Option<&'a str> {
    head_container(cluster)?["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].as_str().unwrap_or_default())
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// The controller

/// One Ray Serve application as the Ray dashboard reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct App {
    /// `NOT_STARTED`, `DEPLOYING`, `RUNNING`, `DEPLOY_FAILED`, `DELETING`, `UNHEALTHY`.
    pub status: String,
    /// Ray Serve's message.
    pub message: String,
}

impl App {
    /// An application in `status` with `message`.
    pub fn new(status: &str, message: &str) -> Self {
        Self {
            status: status.into(),
            message: message.into(),
        }
    }
}

/// The labels of a RayService's head pod, the one that takes Serve traffic: its template's
/// labels, copied onto the pod (`labelPod`, ray-operator/controllers/ray/common/pod.go
/// :1167-1186@v1.7.0), with the operator's own over them: the cluster, the node type and
/// `ray.io/serve=true` (`BuildPod`, :836-843, which the Serve Service selects).
pub fn head_pod_labels(rs: &Value, cluster: &str) -> BTreeMap<String, String> {
    let template = &rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"];
    let mut labels: BTreeMap<String, String> =
        serde_json::from_value(template["metadata"]["labels"].clone()).unwrap_or_default();
    labels.insert("ray.io/cluster".into(), cluster.into());
    labels.insert("ray.io/node-type".into(), "head".into());
    labels.insert("ray.io/serve".into(), "true".into());
    labels
}

/// A RayCluster the operator made for a RayService, and what runs on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// Its name.
    pub name: String,
    /// The cluster spec it was made from, without replicas
    /// (`generateHashWithoutReplicasAndWorkersToDelete`, `rayservice_controller.go:1098-1111@v1.3.0`).
    spec: Value,
    /// False when the RayCluster controller refused it (v1.3.0): its pods never start.
    pub starts: bool,
    /// Worker pods the cluster wants.
    pub desired_workers: i64,
    /// Worker pods ready (the test says).
    pub ready_workers: i64,
    /// Ray Serve's applications once the head is ready (the test says); `None` before.
    pub serve: Option<BTreeMap<String, App>>,
}

impl Cluster {
    /// Ready to take traffic: every application `RUNNING`, and at least one
    /// (`getAndCheckServeStatus`, `rayservice_controller.go:853-901@v1.3.0`).
    fn ready(&self) -> bool {
        self.starts
            && self.serve.as_ref().is_some_and(|apps| {
                !apps.is_empty() && apps.values().all(|a| a.status == "RUNNING")
            })
    }

    fn applications(&self) -> Value {
        match (&self.serve, self.starts) {
            (Some(apps), true) => Value::Object(
                apps.iter()
                    .map(|(name, app)| {
                        (
                            name.clone(),
                            json!({"status": app.status, "message": app.message}),
                        )
                    })
                    .collect(),
            ),
            _ => Value::Null,
        }
    }

    fn status(&self) -> Value {
        json!({
            "desiredWorkerReplicas": self.desired_workers,
            "readyWorkerReplicas": if self.starts { self.ready_workers } else { 0 },
            "availableWorkerReplicas": if self.starts { self.ready_workers } else { 0 },
        })
    }
}

/// What the operator keeps for one RayService.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Clusters {
    /// The cluster serving (the RayService's active cluster).
    pub active: Option<Cluster>,
    /// The cluster being prepared (first deployment, or a zero-downtime upgrade).
    pub pending: Option<Cluster>,
    /// The cluster the head and serve Services select.
    pub serving: Option<String>,
    made: u32,
}

impl Clusters {
    /// The newest cluster (pending, else active): the one whose Serve a test reports on.
    pub fn newest_mut(&mut self) -> Option<&mut Cluster> {
        match self.pending {
            Some(ref mut c) => Some(c),
            None => self.active.as_mut(),
        }
    }
}

/// What one reconcile does to the RayService.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Add [`FINALIZER`] (v1.7.0), and nothing else this time.
    AddFinalizer,
    /// Remove [`FINALIZER`]: the RayService is being deleted and its clusters are gone.
    RemoveFinalizer,
    /// Replace the status with this one (`r.Status().Update`).
    WriteStatus(Value),
    /// Leave the object alone.
    Nothing,
}

/// One reconcile: what to do to the object, and the events it records.
#[derive(Clone, Debug, PartialEq)]
pub struct Reconciled {
    /// The write.
    pub action: Action,
    /// Event messages (`<reason>: <message>`).
    pub events: Vec<String>,
}

impl Reconciled {
    fn new(action: Action) -> Self {
        Self {
            action,
            events: Vec::new(),
        }
    }
}

/// One pass of KubeRay's RayService `Reconcile` over `rs`, at time `now` (RFC 3339),
/// with the clusters and their Serve as `clusters` holds them (updated in place).
pub fn reconcile(version: KubeRay, rs: &Value, clusters: &mut Clusters, now: &str) -> Reconciled {
    let metadata = &rs["metadata"];
    let finalized = metadata["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|v| v == FINALIZER));
    if !metadata["deletionTimestamp"].is_null() {
        // `cleanUpRayClusterInstance` deletes every cluster at once when the RayService is
        // deleted (`rayservice_controller.go:1271-1296@v1.7.0`); v1.3.0 leaves them to the
        // garbage collector (owner references).
        *clusters = Clusters::default();
        return Reconciled::new(if finalized {
            Action::RemoveFinalizer
        } else {
            Action::Nothing
        });
    }
    if version == KubeRay::V1_7_0 && !finalized {
        return Reconciled::new(Action::AddFinalizer);
    }
    let original = rs.get("status").cloned().unwrap_or_else(|| json!({}));
    let mut status = original.clone();
    let mut events = Vec::new();
    let cluster_refusal = match validate(version, rs) {
        Ok(()) => None,
        Err(Refusal::ValidationFailed(message)) => {
            events.push(format!("InvalidRayServiceSpec: {message}"));
            set_condition(
                &mut status,
                "Ready",
                "False",
                "ValidationFailed",
                &message,
                now,
            );
            status["lastUpdateTime"] = json!(now);
            return Reconciled {
                action: write_if_changed(&original, status),
                events,
            };
        }
        Err(Refusal::ServiceEvent(message)) => {
            events.push(format!("InvalidRayServiceSpec: {message}"));
            return Reconciled {
                action: Action::Nothing,
                events,
            };
        }
        Err(Refusal::ClusterEvent(message)) => Some(message),
    };
    reconcile_clusters(
        rs,
        &status,
        clusters,
        cluster_refusal.as_deref(),
        &mut events,
    );
    calculate_status(version, rs, &mut status, clusters, now);
    if status != original {
        status["lastUpdateTime"] = json!(now);
    }
    Reconciled {
        action: write_if_changed(&original, status),
        events,
    }
}

fn write_if_changed(original: &Value, status: Value) -> Action {
    if &status == original {
        Action::Nothing
    } else {
        Action::WriteStatus(status)
    }
}

/// The cluster spec as KubeRay hashes it: without the replica counts.
fn spec_key(rs: &Value) -> Value {
    let mut spec = rs["spec"]["rayClusterConfig"].clone();
    if let Some(groups) = spec["workerGroupSpecs"].as_array_mut() {
        for g in groups.iter_mut().filter_map(Value::as_object_mut) {
            for k in ["replicas", "minReplicas", "maxReplicas", "scaleStrategy"] {
                g.remove(k);
            }
        }
    }
    spec
}

fn desired_workers(rs: &Value) -> i64 {
    groups(&rs["spec"]["rayClusterConfig"])
        .map(|g| g["replicas"].as_i64().unwrap_or(0) * g["numOfHosts"].as_i64().unwrap_or(1))
        .sum()
}

/// `reconcileRayCluster` (`rayservice_controller.go:495-547@v1.3.0`): create the pending
/// cluster the status names; `shouldUpdateCluster` (`:631-657`): update one in place only
/// when worker groups were appended (replica counts alone never reach the cluster).
fn reconcile_clusters(
    rs: &Value,
    status: &Value,
    clusters: &mut Clusters,
    refusal: Option<&str>,
    events: &mut Vec<String>,
) {
    let pending_name = text(&status["pendingServiceStatus"]["rayClusterName"]);
    if pending_name.is_empty() || clusters.pending.is_some() {
        return;
    }
    events.push(format!(
        "CreatedRayCluster: Created the RayCluster {pending_name}"
    ));
    if let Some(message) = refusal {
        events.push(format!(
            "InvalidRayClusterSpec: The RayCluster spec is invalid {pending_name}: {message}"
        ));
    }
    clusters.pending = Some(Cluster {
        name: pending_name.to_string(),
        spec: spec_key(rs),
        starts: refusal.is_none(),
        desired_workers: desired_workers(rs),
        ready_workers: 0,
        serve: None,
    });
}

/// `calculateStatus` (`rayservice_controller.go:226-305@v1.3.0`, `:643-783@v1.7.0`), with
/// the serving decisions of `Reconcile` before it (`:145-187@v1.3.0`, `:229-306@v1.7.0`).
fn calculate_status(
    version: KubeRay,
    rs: &Value,
    status: &mut Value,
    clusters: &mut Clusters,
    now: &str,
) {
    let switched_to = switch_services(clusters);
    status["observedGeneration"] = rs["metadata"]["generation"].clone();
    write_slots(status, clusters);
    let pending_serving = promote(status, clusters, switched_to.as_deref());
    if should_prepare_new_cluster(rs, clusters, pending_serving) {
        clusters.made += 1;
        let suffix = format!("{:05}", clusters.made);
        let name = ray_cluster_name(version, text(&rs["metadata"]["name"]), &suffix);
        status["pendingServiceStatus"] = json!({ "rayClusterName": name });
        // A pending cluster of an older spec is replaced (`cleanUpRayClusterInstance`).
        clusters.pending = None;
    }
    // The serve Service's ready endpoints: the serving cluster's pods, once its
    // applications run (head included, `excludeHeadPodFromServeSvc` unset).
    let endpoints = clusters
        .active
        .as_ref()
        .filter(|c| Some(&c.name) == clusters.serving.as_ref() && c.ready())
        .map_or(0, |c| 1 + c.ready_workers);
    set_or_remove(
        status,
        "numServeEndpoints",
        (endpoints > 0).then(|| json!(endpoints)),
    );
    calculate_conditions(status, endpoints, now);
    let running = condition_is(status, "Ready", "True").then(|| json!("Running"));
    set_or_remove(status, "serviceStatus", running);
}

/// Serve is reconciled on the pending cluster if there is one, else on the active one;
/// the Services move to a ready one, pending first (`reconcileServicesToReadyCluster`).
/// Otherwise they stay put and nothing is promoted in this pass (`None`).
fn switch_services(clusters: &mut Clusters) -> Option<String> {
    let pending_ready = clusters.pending.as_ref().is_some_and(Cluster::ready);
    let active_ready =
        clusters.pending.is_none() && clusters.active.as_ref().is_some_and(Cluster::ready);
    let target = if pending_ready {
        clusters.pending.as_ref().map(|c| c.name.clone())
    } else if active_ready {
        clusters.active.as_ref().map(|c| c.name.clone())
    } else {
        None
    };
    if let Some(name) = &target {
        clusters.serving = Some(name.clone());
    }
    target
}

/// Each slot's cluster status and application statuses. Applications come only from
/// the cluster whose Serve was reconciled: the active cluster's are dropped while a
/// pending cluster exists (`rayservice_controller.go:239-244@v1.3.0`).
fn write_slots(status: &mut Value, clusters: &Clusters) {
    let cluster_status =
        |c: &Option<Cluster>| c.as_ref().map_or_else(|| json!({}), Cluster::status);
    let apps = |c: &Option<Cluster>| c.as_ref().map_or(Value::Null, Cluster::applications);
    let active_apps = if clusters.pending.is_none() {
        apps(&clusters.active)
    } else {
        Value::Null
    };
    for (slot, cluster, applications) in [
        ("activeServiceStatus", &clusters.active, active_apps),
        (
            "pendingServiceStatus",
            &clusters.pending,
            apps(&clusters.pending),
        ),
    ] {
        set_slot(status, slot, "rayClusterStatus", cluster_status(cluster));
        set_slot(status, slot, "applicationStatuses", applications);
    }
}

/// Promotion: when the Services point at the pending cluster, the pending slot becomes
/// the active one (`rayservice_controller.go:246-272@v1.3.0`). Whether the pending
/// cluster is the one serving.
fn promote(status: &mut Value, clusters: &mut Clusters, switched_to: Option<&str>) -> bool {
    let Some(target) = switched_to else {
        return false;
    };
    let pending_serving = target == text(&status["pendingServiceStatus"]["rayClusterName"]);
    if target != text(&status["activeServiceStatus"]["rayClusterName"]) {
        status["activeServiceStatus"] = status["pendingServiceStatus"].take();
        status["pendingServiceStatus"] = json!({});
        clusters.active = clusters.pending.take();
    }
    pending_serving
}

fn set_or_remove(status: &mut Value, key: &str, value: Option<Value>) {
    match (value, status.as_object_mut()) {
        (Some(v), Some(map)) => {
            map.insert(key.to_string(), v);
        }
        (None, Some(map)) => {
            map.remove(key);
        }
        _ => {}
    }
}

fn set_slot(status: &mut Value, slot: &str, key: &str, value: Value) {
    if !status[slot].is_object() {
        status[slot] = json!({});
    }
    let Some(map) = status[slot].as_object_mut() else {
        return;
    };
    if value.is_null() {
        map.remove(key);
    } else {
        map.insert(key.to_string(), value);
    }
}

/// `shouldPrepareNewCluster` (`rayservice_controller.go:689-711@v1.3.0`,
/// `:1409-1437@v1.7.0`): a new cluster for a new RayService, or for a cluster spec that
/// changed beyond replica counts and appended worker groups (zero-downtime upgrades are
/// on unless `upgradeStrategy.type` is `None`).
fn should_prepare_new_cluster(rs: &Value, clusters: &Clusters, pending_serving: bool) -> bool {
    if pending_serving {
        return false;
    }
    // Neither cluster exists: the RayService was just created.
    let Some(cluster) = clusters.pending.as_ref().or(clusters.active.as_ref()) else {
        return true;
    };
    let goal = spec_key(rs);
    if goal == cluster.spec || appended_groups_only(&cluster.spec, &goal) {
        return false;
    }
    rs["spec"]["upgradeStrategy"]["type"].as_str() != Some("None")
}

/// `isClusterSpecHashEqual(..., partial=true)`: the goal equals the cluster's spec once
/// worker groups appended at the end are left out.
fn appended_groups_only(cluster: &Value, goal: &Value) -> bool {
    let (Some(have), Some(want)) = (
        cluster["workerGroupSpecs"].as_array(),
        goal["workerGroupSpecs"].as_array(),
    ) else {
        return false;
    };
    if want.len() < have.len() {
        return false;
    }
    let mut trimmed = goal.clone();
    trimmed["workerGroupSpecs"] = Value::Array(want[..have.len()].to_vec());
    &trimmed == cluster
}

/// `calculateConditions` (`rayservice_controller.go:307-334@v1.3.0`, `:785-818@v1.7.0`).
fn calculate_conditions(status: &mut Value, endpoints: i64, now: &str) {
    if status["conditions"].as_array().is_none_or(Vec::is_empty) {
        let m = "RayService is initializing";
        set_condition(status, "Ready", "False", "Initializing", m, now);
        set_condition(status, "UpgradeInProgress", "False", "Initializing", m, now);
    }
    if endpoints > 0 {
        set_condition(
            status,
            "Ready",
            "True",
            "NonZeroServeEndpoints",
            "Number of serve endpoints is greater than 0",
            now,
        );
    } else if condition_is(status, "Ready", "True") {
        set_condition(
            status,
            "Ready",
            "False",
            "ZeroServeEndpoints",
            "Number of serve endpoints dropped to 0",
            now,
        );
    }
    let active = text(&status["activeServiceStatus"]["rayClusterName"]).to_string();
    let pending = text(&status["pendingServiceStatus"]["rayClusterName"]).to_string();
    if !active.is_empty() && !pending.is_empty() {
        set_condition(
            status,
            "UpgradeInProgress",
            "True",
            "BothActivePendingClustersExist",
            "Both active and pending Ray clusters exist",
            now,
        );
    } else if !active.is_empty() {
        set_condition(
            status,
            "UpgradeInProgress",
            "False",
            "NoPendingCluster",
            "Active Ray cluster exists and no pending Ray cluster",
            now,
        );
    } else {
        let reason = condition(status, "UpgradeInProgress").map(|c| text(&c["reason"]).to_string());
        if reason.as_deref() != Some("Initializing") {
            set_condition(
                status,
                "UpgradeInProgress",
                "Unknown",
                "NoActiveCluster",
                "No active Ray cluster exists, and the RayService is not initializing. Please open a GitHub issue in the KubeRay repository.",
                now,
            );
        }
    }
}

fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn condition_is(status: &Value, type_: &str, value: &str) -> bool {
    condition(status, type_).is_some_and(|c| c["status"] == value)
}

/// `meta.SetStatusCondition` through KubeRay's `setCondition`: the transition time moves
/// only when the status changes; `observedGeneration` is the status's.
fn set_condition(
    status: &mut Value,
    type_: &str,
    value: &str,
    reason: &str,
    message: &str,
    now: &str,
) {
    let generation = status["observedGeneration"].clone();
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    let Some(list) = status["conditions"].as_array_mut() else {
        return;
    };
    let mut c = Map::new();
    c.insert("type".into(), json!(type_));
    c.insert("status".into(), json!(value));
    c.insert("reason".into(), json!(reason));
    c.insert("message".into(), json!(message));
    if generation.is_i64() {
        c.insert("observedGeneration".into(), generation);
    }
    if let Some(existing) = list.iter_mut().find(|x| x["type"] == type_) {
        // The transition time moves only when the status does.
        let since = if existing["status"] == value {
            existing["lastTransitionTime"].clone()
        } else {
            json!(now)
        };
        c.insert("lastTransitionTime".into(), since);
        *existing = Value::Object(c);
    } else {
        c.insert("lastTransitionTime".into(), json!(now));
        list.push(Value::Object(c));
    }
}
