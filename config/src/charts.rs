//! The Helm charts' values, as Rust types: one source for every chart's
//! `values.schema.json` (which `helm lint`, `helm template` and `helm install` check the
//! values against: a wrong type or an unknown key fails) and for the values table of each
//! chart's README. Keys shared by the charts are one type each, so they are named alike
//! everywhere: [`ChartCommon`] for every chart, [`Workload`] for every Deployment and
//! DaemonSet (the library chart `charts/kubeairunway-lib` renders them).
//!
//! The types only describe values (the charts read them; no Rust code does), so they
//! derive `JsonSchema` alone; their doc comments are the descriptions users read.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, PodSecurityContext, ResourceRequirements,
    SecurityContext, Toleration,
};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

/// The image of the platform: every binary is in it, each container runs its own.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Image {
    /// Repository of the platform's image.
    pub repository: String,
    /// Tag; empty means the chart's appVersion (the release, without a "v").
    pub tag: String,
    /// A digest (sha256:...) pinning the image instead of the tag.
    #[schemars(regex(pattern = r"^(sha256:[0-9a-f]{64})?$"))]
    pub digest: String,
    /// When the kubelet pulls the image.
    pub pull_policy: PullPolicy,
}

/// Kubernetes' imagePullPolicy.
#[derive(Debug, JsonSchema)]
pub enum PullPolicy {
    /// Pull on every start.
    Always,
    /// Pull when not on the node.
    IfNotPresent,
    /// Never pull.
    Never,
}

/// Log line format.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

/// Keys every chart has.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChartCommon {
    /// Replaces the chart's name in object names and the app.kubernetes.io/name label.
    pub name_override: String,
    /// Replaces the release's full name (the prefix of every object's name).
    pub fullname_override: String,
    /// The platform's image.
    pub image: Image,
    /// Secrets for pulling the image.
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Log format of every container (--log-format).
    pub log_format: LogFormat,
    /// RUST_LOG of every container, e.g. "info,kubeairunway_sdk=debug".
    pub log_level: String,
}

/// A Prometheus Operator PodMonitor for the component's /metrics.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodMonitor {
    /// Render the PodMonitor (monitoring.coreos.com/v1; needs the Prometheus Operator CRDs).
    pub enabled: bool,
    /// Scrape interval, e.g. 30s; empty: Prometheus' default.
    pub interval: String,
    /// Scrape timeout; empty: Prometheus' default.
    pub scrape_timeout: String,
    /// Extra labels on the PodMonitor (to match a Prometheus' podMonitorSelector).
    pub labels: BTreeMap<String, String>,
}

/// The component's metrics endpoint.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    /// Port of /metrics, /healthz and /readyz (--metrics-bind-address 0.0.0.0:<port>).
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// The PodMonitor.
    pub pod_monitor: PodMonitor,
}

/// What every Deployment and DaemonSet of the platform takes, named alike in every chart.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// The metrics endpoint and its PodMonitor.
    pub metrics: Metrics,
    /// Flags added after the chart's own (a flag the chart already sets cannot be given
    /// again: the binaries refuse a repeated flag).
    pub extra_args: Vec<String>,
    /// Environment variables added to the container.
    pub extra_env: Vec<EnvVar>,
    /// Labels added to the pods.
    pub pod_labels: BTreeMap<String, String>,
    /// Annotations added to the pods.
    pub pod_annotations: BTreeMap<String, String>,
    /// The pods' priorityClassName.
    pub priority_class_name: String,
    /// The pods' securityContext.
    pub pod_security_context: PodSecurityContext,
    /// The container's securityContext.
    pub security_context: SecurityContext,
    /// The container's resources.
    pub resources: ResourceRequirements,
    /// The pods' nodeSelector.
    pub node_selector: BTreeMap<String, String>,
    /// The pods' tolerations.
    pub tolerations: Vec<Toleration>,
    /// The pods' affinity.
    pub affinity: Affinity,
}

/// Leader election on a Lease in the release namespace (the process runtime's
/// --leader-elect flags): one replica works, the others stand by.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderElection {
    /// Elect a leader; required when replicaCount is above 1.
    pub enabled: bool,
    /// How long the others wait, from their own observation of the last renewal.
    pub lease_duration: String,
    /// How long the leader keeps leading without a successful renewal (< leaseDuration).
    pub renew_deadline: String,
    /// How often the leader renews and the others look.
    pub retry_period: String,
}

/// The component's ServiceAccount.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccount {
    /// Create it; otherwise `name` must exist.
    pub create: bool,
    /// Its name; empty: the release's full name.
    pub name: String,
    /// Annotations on it (e.g. for workload identity).
    pub annotations: BTreeMap<String, String>,
}

/// CRDs shipped as templates.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Crds {
    /// Install the CRDs with this release: `helm upgrade` upgrades them, `helm uninstall`
    /// keeps them (helm.sh/resource-policy: keep). False when they are managed apart.
    pub install: bool,
}

/// A one-Deployment chart with leader election: core and every provider.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Controller {
    /// Replicas; above 1 needs leaderElection.enabled.
    #[schemars(range(min = 0))]
    pub replica_count: i32,
    /// Leader election.
    pub leader_election: LeaderElection,
    /// The ServiceAccount.
    pub service_account: ServiceAccount,
    #[serde(flatten)]
    pub workload: Workload,
}

// ---- core ---------------------------------------------------------------------------

/// Webhook failure policy.
#[derive(Debug, JsonSchema)]
pub enum FailurePolicy {
    /// Refuse the request when the webhook cannot be called.
    Fail,
    /// Let the request through.
    Ignore,
}

/// The core chart's admission webhooks.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoreWebhook {
    /// The webhook server's port (--webhook-bind-address 0.0.0.0:<port>).
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Both webhooks: Fail, so that nothing the rules refuse is stored (the mutating
    /// webhook validates creations).
    pub failure_policy: FailurePolicy,
    /// Have the validating webhook check creations too, after every mutation (one more
    /// call to core per create). Off: the mutating webhook validates a creation, and the
    /// API server calls it again when a later mutating webhook or policy changes the
    /// object (reinvocation); turn on when something mutates ModelDeployments after
    /// that.
    pub validate_creations: bool,
    /// Seconds the API server waits for a webhook.
    #[schemars(range(min = 1, max = 30))]
    pub timeout_seconds: i32,
    /// Lifetime of the CA the controller makes (--webhook-ca-validity); the CA and its key
    /// are kept in a Secret of their own, apart from the serving pair.
    pub ca_validity: String,
    /// Lifetime of the serving certificate (--webhook-cert-validity).
    pub cert_validity: String,
    /// Rotate the serving certificate this long before it expires.
    pub rotate_before: String,
    /// How often the certificate is checked.
    pub check_interval: String,
    /// A ConfigMap in the release namespace whose `ca.crt` signs the client certificate
    /// the API server presents to webhooks (its admission configuration's
    /// `kubeConfigFile`): the webhook then answers nobody else
    /// (--webhook-client-ca-file). Empty: any caller that reaches it is answered.
    pub client_ca_config_map: String,
}

/// A PodDisruptionBudget.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionBudget {
    /// Keep one replica through voluntary disruptions (only with replicaCount > 1).
    pub enabled: bool,
}

/// A NetworkPolicy letting only the API server reach a webhook: a forged AdmissionReview
/// from another pod would otherwise be answered. Off by default: the API server's address
/// differs per cluster (control-plane nodes, a konnectivity agent, a managed VPC range),
/// and a policy that leaves it out refuses every admission the webhook takes part in.
/// Takes effect only where the CNI enforces NetworkPolicies.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookNetworkPolicy {
    /// Install the NetworkPolicy (apiServer must then name at least one peer).
    pub enabled: bool,
    /// Where the API server's webhook calls come from, as NetworkPolicy peers: an
    /// ipBlock of the control plane's addresses, or the pods of a konnectivity agent.
    pub api_server: Vec<NetworkPolicyPeer>,
    /// Peers allowed to scrape the metrics port (a Prometheus namespace, say); empty:
    /// none besides the node's own kubelet probes, which NetworkPolicies never block.
    pub metrics_from: Vec<NetworkPolicyPeer>,
}

/// RBAC for users.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserRbac {
    /// ClusterRoles that add ModelDeployments (and their scale subresource) to
    /// Kubernetes' admin, edit and view roles.
    pub aggregate_to_default_roles: bool,
}

/// The core chart's gateway.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoreGateway {
    /// Run the gateway (and grant it its permissions).
    pub enabled: bool,
    /// The Gateway to route from, as <namespace>/<name> (empty: the only Gateway, else the
    /// one labelled kubeairunway.ai/inference-gateway=true). It is never changed.
    pub name: String,
}

/// The dashboard in the cluster (`kubeairunway dashboard --in-cluster`, docs/dashboard.md):
/// every user signs in with their own Kubernetes bearer token (or an authenticating proxy
/// passes it in `Authorization: Bearer`) and acts as themselves. It holds no credentials:
/// its pod mounts no ServiceAccount token and no RBAC is granted to it.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoreDashboard {
    /// Install the dashboard's Deployment and Service.
    pub enabled: bool,
    /// The port it serves on (the Service's too).
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// The Service's type.
    pub service_type: ServiceType,
    /// Hosts users reach it by (an Ingress host, say), with any port unless one is given
    /// (--allowed-host); loopback (kubectl port-forward) is always served. A request
    /// naming another Host is refused (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// A session unused this long ends (--session-idle).
    pub session_idle: String,
    /// A session ends this long after sign-in (--session-lifetime).
    pub session_lifetime: String,
    /// Sessions alive at once; one more ends the least recently used (--max-sessions).
    #[schemars(range(min = 1))]
    pub max_sessions: i32,
    /// A session cookie without `Secure`, for a dashboard reached over plain HTTP by a
    /// name other than localhost (not recommended: put TLS in front instead).
    pub insecure_cookie: bool,
    /// The Hugging Face hub the Models page searches (a mirror, say).
    pub hf_endpoint: String,
    /// No Hugging Face search: the built-in catalogue only (air-gapped clusters).
    pub offline: bool,
    /// Labels added to the pod.
    pub pod_labels: BTreeMap<String, String>,
    /// The container's resources.
    pub resources: ResourceRequirements,
    /// The pod's nodeSelector.
    pub node_selector: BTreeMap<String, String>,
    /// The pod's tolerations.
    pub tolerations: Vec<Toleration>,
    /// The pod's affinity.
    pub affinity: Affinity,
}

/// A Service's type.
#[derive(Debug, JsonSchema)]
pub enum ServiceType {
    /// Reached inside the cluster (an Ingress or `kubectl port-forward` in front).
    ClusterIP,
    /// On a port of every node.
    NodePort,
    /// Through the cloud's load balancer.
    LoadBalancer,
}

/// Values of the core chart (`charts/kubeairunway`).
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoreValues {
    #[serde(flatten)]
    pub common: ChartCommon,
    /// The ModelDeployment and InferenceProviderConfig CRDs.
    pub crds: Crds,
    /// User-facing RBAC.
    pub rbac: UserRbac,
    /// Built-in provider selection; false when a custom selector sets status.provider.name.
    pub enable_provider_selector: bool,
    /// Providers whose heartbeat is older than this are not selected.
    pub provider_heartbeat_max_age: String,
    /// How long a deleted ModelDeployment waits for an uninstalled provider before core
    /// removes that provider's finalizer.
    pub finalizer_timeout: String,
    /// Only reconcile ModelDeployments of this namespace (empty: all).
    pub watch_namespace: String,
    /// The gateway: InferencePool, endpoint picker and HTTPRoute per ModelDeployment with
    /// spec.gateway.enabled.
    pub gateway: CoreGateway,
    /// The admission webhooks.
    pub webhook: CoreWebhook,
    /// The controller's PodDisruptionBudget.
    pub pod_disruption_budget: DisruptionBudget,
    /// Who may reach the webhooks and metrics.
    pub network_policy: WebhookNetworkPolicy,
    /// The dashboard in the cluster, each user signed in as themselves.
    pub dashboard: CoreDashboard,
    #[serde(flatten)]
    pub controller: Controller,
}

// ---- providers ----------------------------------------------------------------------

/// The SDK provider runtime's flags (sdk/README.md).
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderRuntime {
    /// How long deletion waits for the upstream objects before removing the finalizer.
    pub finalizer_timeout: String,
    /// How long an unchanged upstream status may stand while not Running before
    /// StaleStatus.
    pub stale_status_after: String,
    /// Between InferenceProviderConfig heartbeats.
    pub heartbeat_interval: String,
    /// How often every ModelDeployment is looked at again without a change.
    pub resync_period: String,
    /// The cluster's DNS domain, for status.url
    /// (http://<service>.<namespace>.svc.<domain>:<port>/v1).
    pub cluster_domain: String,
}

/// Values of a provider chart: the shared keys, the runtime's, and the provider's own.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderValues<T> {
    #[serde(flatten)]
    pub common: ChartCommon,
    /// The SDK provider runtime.
    pub runtime: ProviderRuntime,
    #[serde(flatten)]
    pub controller: Controller,
    #[serde(flatten)]
    pub provider: T,
}

/// KAITO InferenceSet use for replicas other than 1.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InferenceSetMode {
    /// Use it when its CRD is installed at start.
    Auto,
    /// Always.
    Enabled,
    /// Never: refuse replicas other than 1.
    Disabled,
}

/// How KAITO gets nodes.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeProvisioningMode {
    /// KAITO's node auto-provisioning (its default).
    Auto,
    /// Bring-your-own nodes (KAITO --node-provisioner=byo).
    Byo,
}

/// How KAITO gets nodes; must match the KAITO operator's own setting.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeProvisioning {
    /// auto (every Workspace names an instance type) or byo (none; GPU nodes chosen by
    /// spec.nodeSelector, labelled by NVIDIA GPU Feature Discovery).
    pub mode: NodeProvisioningMode,
    /// With auto: the instance type of deployments with GPUs.
    pub gpu_instance_type: String,
    /// With auto: the instance type of CPU-only deployments.
    pub cpu_instance_type: String,
}

/// The KAITO provider's own values.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Kaito {
    /// Replicas other than 1 through KAITO's InferenceSet (--inference-set).
    pub inference_set: InferenceSetMode,
    /// Node provisioning (--node-provisioning, --gpu-instance-type, --cpu-instance-type).
    pub node_provisioning: NodeProvisioning,
}

/// The Dynamo provider's own values.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Dynamo {
    /// Tag of the nvcr.io/nvidia/ai-dynamo/*-runtime images (--dynamo-version).
    pub dynamo_version: String,
    /// How long Dynamo's `failed` state must last before the ModelDeployment is Failed.
    pub failed_threshold: String,
}

/// The Ray LLM image.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ray {
    /// Tag of the Ray LLM image (--ray-version); up to its first "-" the rayVersion.
    pub version: String,
    /// Repository of the Ray LLM image, unless a ModelDeployment sets spec.image.
    pub image: String,
}

/// The KubeRay provider's own values.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeRay {
    /// The Ray LLM image.
    pub ray: Ray,
}

/// The serving image of each engine, unless a ModelDeployment sets spec.image.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineImages {
    /// The vLLM image (--vllm-image); empty: spec.image is required for vLLM.
    pub vllm: String,
    /// The SGLang image (--sglang-image); empty: spec.image is required for SGLang.
    pub sglang: String,
    /// The llama.cpp server image of replicas without GPUs (--llamacpp-image).
    pub llamacpp: String,
    /// The llama.cpp server image of replicas with GPUs, a CUDA build (--llamacpp-gpu-image).
    pub llamacpp_gpu: String,
}

/// The Deployment provider's own values.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deployment {
    /// The serving images.
    pub engine_images: EngineImages,
}

// ---- kernel cache -------------------------------------------------------------------

/// The kernel-cache controller.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelCacheController {
    /// Install the controller.
    pub enabled: bool,
    /// The cluster-scoped KernelCachePolicy that decides what is trusted (--policy).
    pub policy: String,
    /// Look at every cache this often without a change (--resync).
    pub resync: String,
    /// Where the controller may read the image pull Secrets that KernelCaches name and
    /// the hub-token Secrets that ModelCaches name; a cache naming a Secret elsewhere
    /// fails with "forbidden".
    pub pull_secrets: Vec<PullSecrets>,
    #[serde(flatten)]
    pub controller: ControllerNoAccount,
}

/// Pull Secrets the kernel-cache controller may read in one namespace.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PullSecrets {
    /// The namespace.
    pub namespace: String,
    /// The Secrets' names; empty: every Secret of the namespace.
    #[serde(default)]
    pub names: Vec<String>,
}

/// The registry-credentials handover namespace.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    /// The controller copies the one registry entry each cache needs into a Secret of
    /// this namespace, the only place the agents read Secrets from
    /// (--credentials-namespace). Keep nothing else in it.
    pub namespace: String,
    /// Create the namespace with the release.
    pub create: bool,
}

/// A Deployment with leader election whose ServiceAccount the chart names itself.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControllerNoAccount {
    /// Replicas; above 1 needs leaderElection.enabled.
    #[schemars(range(min = 0))]
    pub replica_count: i32,
    /// Leader election.
    pub leader_election: LeaderElection,
    #[serde(flatten)]
    pub workload: Workload,
}

/// GPU detection settings of the agent's NVIDIA runtime.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Nvidia {
    /// NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES=utility, so the NVIDIA
    /// container runtime mounts libnvidia-ml (no GPU is allocated).
    pub env: bool,
}

/// The node agent (a DaemonSet).
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelCacheAgent {
    /// Install the agent.
    pub enabled: bool,
    /// Where caches are staged on each node (a hostPath; --cache-root).
    pub cache_root: String,
    /// Largest cache content accepted, in bytes (--max-cache-bytes).
    #[schemars(range(min = 1))]
    pub max_cache_bytes: i64,
    /// Most tar entries accepted in one cache layer (--max-cache-files).
    #[schemars(range(min = 1))]
    pub max_cache_files: i64,
    /// Reconcile this often without a change (--resync).
    pub resync: String,
    /// Rewrite the KernelCacheNode status this often (--status-refresh).
    pub status_refresh: String,
    /// Caches pulled and extracted at the same time on one node (--parallel-stages).
    #[schemars(range(min = 1))]
    pub parallel_stages: i32,
    /// What all caches together may take on a node (--disk-budget): bytes, a quantity
    /// (20Gi) or a share of the cache root's filesystem (20%); empty: no budget. A cache
    /// that does not fit evicts the least recently used caches no pod on the node uses.
    #[schemars(regex(pattern = r"^([0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?|[0-9]{1,3}%)?$"))]
    pub disk_budget: String,
    /// Free space no stage goes below on the cache root's filesystem (--min-free): bytes,
    /// a quantity or a share. At or above the kubelet's nodefs eviction threshold (10% by
    /// default) where the cache root is on the kubelet's filesystem.
    #[schemars(regex(pattern = r"^([0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?|[0-9]{1,3}%)$"))]
    pub min_free: String,
    /// Model caches (ModelCache): downloaded by the same agent.
    pub model_caches: AgentModelCaches,
    /// GPUs of nodes NVML cannot see, used on every node of this DaemonSet (--gpu-inventory),
    /// e.g. [{name: AMD Instinct MI210, backend: hip, arch: gfx90a}].
    pub gpu_inventory: Vec<GpuEntry>,
    /// The NVIDIA container runtime's environment.
    pub nvidia: Nvidia,
    /// The pods' runtimeClassName (e.g. nvidia where it is not the default runtime).
    pub runtime_class_name: String,
    /// The DaemonSet's updateStrategy.
    pub update_strategy: k8s_openapi::api::apps::v1::DaemonSetUpdateStrategy,
    /// Hand the cache roots to podSecurityContext.runAsUser:runAsGroup before the agent
    /// starts: an init container, root with CAP_CHOWN alone, changes the owner of the
    /// roots and everything under them (not when runAsUser is 0 or unset).
    pub own_cache_roots: bool,
    #[serde(flatten)]
    pub workload: Workload,
}

/// The agent's model-cache downloads.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentModelCaches {
    /// Download ModelCaches on the agent's nodes.
    pub enabled: bool,
    /// Where model caches go on each node (a hostPath; HF_HOME, the Hugging Face cache
    /// layout under <root>/hub; --model-cache-root of the agents, and of the controller,
    /// whose local PersistentVolumes for serving pods point below it).
    pub root: String,
    /// The Hugging Face hub to download from (--hf-endpoint).
    pub hf_endpoint: String,
    /// ModelCaches downloaded at the same time on one node (--parallel-model-downloads).
    #[schemars(range(min = 1, max = 65535))]
    pub parallel_downloads: i32,
    /// Files fetched at the same time within one download (--model-download-files).
    #[schemars(range(min = 1, max = 65535))]
    pub parallel_files: i32,
    /// Download progress alone is written to the KernelCacheNode at most this often
    /// (--model-progress-every).
    pub progress_every: String,
    /// A Ready ModelCache at a branch or tag is resolved again this often, and a new
    /// upstream commit downloaded next to the one in use; "off": only on a spec change or
    /// an agent restart (--model-refresh-every).
    pub refresh_every: String,
}

/// One GPU of an inventory (the agent's inventory file format,
/// providers/kernelcache/src/agent/gpu.rs).
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuEntry {
    /// Device index.
    pub index: Option<i32>,
    /// A name for reports.
    pub name: Option<String>,
    /// cuda or hip.
    pub backend: String,
    /// The architecture: CUDA major*10+minor (e.g. "90") or a gfx name.
    pub arch: String,
    /// Threads per warp (default 32 for cuda, 64 for hip).
    pub warp_size: Option<i32>,
    /// The driver's version.
    pub driver_version: Option<String>,
}

/// The pod-injection webhook.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelCacheWebhook {
    /// Install the webhook.
    pub enabled: bool,
    /// Replicas; every one serves the webhook.
    #[schemars(range(min = 0))]
    pub replica_count: i32,
    /// The webhook's HTTPS port (--webhook-bind-address 0.0.0.0:<port>).
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Seconds the API server waits for the webhook.
    #[schemars(range(min = 1, max = 30))]
    pub timeout_seconds: i32,
    /// Lifetime of the CA the webhook makes (--webhook-ca-validity); the CA and its key
    /// are kept in a Secret of their own, apart from the serving pair.
    pub ca_validity: String,
    /// A ConfigMap in the release namespace whose `ca.crt` signs the client certificate
    /// the API server presents to webhooks (its admission configuration's
    /// `kubeConfigFile`): the webhook then answers nobody else
    /// (--webhook-client-ca-file). Empty: any caller that reaches it is answered.
    pub client_ca_config_map: String,
    /// Image of the kernelcache-seed init container added to serving pods; empty: this
    /// chart's image.
    pub seed_image: String,
    /// The cluster serves Kubernetes image volumes (feature ImageVolume, beta in 1.33):
    /// namespaces enforcing the baseline Pod Security level then get caches through them
    /// (--image-volumes); namespaces enforcing restricted never get a cache.
    pub image_volumes: bool,
    /// Where caches may come from the node's disk (hostPath) in namespaces that enforce
    /// no Pod Security level (--host-paths): only in namespaces labelled
    /// cache.kubeairunway.ai/host-path=allowed, or everywhere when no other policy of the
    /// cluster (Pod Security defaults, SCCs, policy engines) refuses hostPath volumes.
    pub host_paths: HostPathsMode,
    /// Who may reach the webhook and its metrics.
    pub network_policy: WebhookNetworkPolicy,
    #[serde(flatten)]
    pub workload: Workload,
}

/// Where the pod webhook may mount caches from the node's disk.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HostPathsMode {
    /// Namespaces labelled cache.kubeairunway.ai/host-path=allowed (and those enforcing
    /// privileged).
    Labelled,
    /// Every namespace whose Pod Security level does not forbid it.
    Everywhere,
}

/// The warmup controller (`kernelcache-warmup`).
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelCacheWarmup {
    /// Install the warmup controller.
    pub enabled: bool,
    /// What custom actions may do beyond the Pod Security baseline rules (the controller
    /// creates their pods with its own identity, on every node the target reaches).
    pub custom_actions: CustomActions,
    #[serde(flatten)]
    pub controller: ControllerNoAccount,
}

/// What a Warmup's custom action may do beyond the Pod Security baseline rules.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomActions {
    /// Let custom actions run privileged pods: the node's namespaces, privileged
    /// containers, any capability, any hostPath (--allow-privileged-custom-actions). Anyone
    /// who may write a Warmup or a ModelDeployment then has root on every GPU node.
    pub allow_privileged: bool,
    /// Host paths (and what is below them) custom actions may mount
    /// (--custom-action-host-path).
    pub host_paths: Vec<String>,
    /// Service accounts custom actions may run as besides their namespace's default
    /// (--custom-action-service-account).
    pub service_accounts: Vec<String>,
}

/// Values of the kernel-cache chart (`charts/kernelcache-provider`).
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelCacheValues {
    #[serde(flatten)]
    pub common: ChartCommon,
    /// The KernelCache, KernelCacheNode, KernelCachePolicy and Warmup CRDs.
    pub crds: Crds,
    /// Registries (host:port) the controller and the agents speak to over plain HTTP
    /// (--plain-http-registry; air-gapped mirrors, tests).
    pub plain_http_registries: Vec<String>,
    /// Registries cache images may come from (host, host:port, or with a repository
    /// prefix: ghcr.io/acme), checked by the controller before it resolves an image and
    /// by the agents before they pull (--allowed-registry). Empty: any registry, so a
    /// KernelCache's author can make them speak to any host and port.
    pub allowed_registries: Vec<String>,
    /// The registry-credentials handover namespace.
    pub credentials: Credentials,
    /// The controller.
    pub controller: KernelCacheController,
    /// The node agent.
    pub agent: KernelCacheAgent,
    /// The pod webhook.
    pub webhook: KernelCacheWebhook,
    /// The warmup controller (Warmups).
    pub warmup: KernelCacheWarmup,
}

// ---- generation ---------------------------------------------------------------------

/// The library chart every chart depends on (helm adds its name as a values key).
pub const LIBRARY: &str = "kubeairunway-lib";

/// The charts with values, and the schema of each.
pub fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        ("kubeairunway", schema_of::<CoreValues>()),
        ("kaito-provider", schema_of::<ProviderValues<Kaito>>()),
        ("dynamo-provider", schema_of::<ProviderValues<Dynamo>>()),
        ("kuberay-provider", schema_of::<ProviderValues<KubeRay>>()),
        (
            "deployment-provider",
            schema_of::<ProviderValues<Deployment>>(),
        ),
        ("kernelcache-provider", schema_of::<KernelCacheValues>()),
    ]
}

/// The values.schema.json of `T`: JSON Schema draft 7 (what helm 3 and 4 read), closed
/// objects, Kubernetes' int-or-string types as such, and the leader-election rule.
pub fn schema_of<T: JsonSchema>() -> Value {
    let schema = SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<T>();
    let mut value = schema.to_value();
    if let Some(defs) = value.get_mut("definitions").and_then(Value::as_object_mut) {
        for (name, def) in defs.iter_mut() {
            if name.starts_with("io.k8s.") {
                strip_descriptions(def);
            }
        }
    }
    close_objects(&mut value);
    if let Some(props) = value.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert(
            LIBRARY.into(),
            json!({"description": "Values of the library chart (none).", "type": "object"}),
        );
        props.insert(
            "global".into(),
            json!({"description": "Helm's values shared with subcharts.", "type": "object"}),
        );
    }
    value
}

/// Every object schema with properties refuses other keys; Kubernetes' int-or-string
/// (Quantity, IntOrString) takes a number or a string; a component with a replicaCount
/// and a leaderElection refuses more than one replica without election.
fn close_objects(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.remove("x-kubernetes-int-or-string").is_some() {
                map.insert("type".into(), json!(["string", "number"]));
            }
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            let has = |key: &str| {
                map.get("properties")
                    .and_then(Value::as_object)
                    .is_some_and(|p| p.contains_key(key))
            };
            let rule = has("replicaCount") && has("leaderElection");
            for v in map.values_mut() {
                close_objects(v);
            }
            // After closing: the rule's own subschemas stay open.
            if rule {
                leader_election_rule(map);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// replicaCount > 1 requires leaderElection.enabled: true (only one replica may reconcile).
fn leader_election_rule(map: &mut Map<String, Value>) {
    map.insert(
        "if".into(),
        json!({"properties": {"replicaCount": {"minimum": 2}}, "required": ["replicaCount"]}),
    );
    map.insert(
        "then".into(),
        json!({"properties": {"leaderElection": {
            "properties": {"enabled": {"const": true, "description": "replicaCount > 1 requires leaderElection.enabled=true"}},
            "required": ["enabled"]}}}),
    );
}

fn strip_descriptions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("description");
            if let Some(props) = map.get_mut("properties").and_then(Value::as_object_mut) {
                props.values_mut().for_each(strip_descriptions);
            }
            for key in ["items", "additionalProperties"] {
                if let Some(v) = map.get_mut(key) {
                    strip_descriptions(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

/// One row of a chart's values table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Dotted key.
    pub key: String,
    /// JSON Schema type.
    pub type_: String,
    /// Default from values.yaml, as compact JSON.
    pub default: Option<String>,
    /// The description.
    pub description: String,
}

/// The rows of a chart's values table: every key the schema describes, down to the
/// platform's own types (Kubernetes types and maps are one row each), with the default
/// from `values`.
pub fn rows(schema: &Value, values: &Value) -> Vec<Row> {
    let mut out = Vec::new();
    walk(schema, schema, "", values, &mut out);
    out
}

fn resolve<'a>(root: &'a Value, schema: &'a Value) -> (&'a Value, Option<&'a str>) {
    // A described reference is {"description", "allOf": [{"$ref"}]} in draft 7.
    let reference = schema.get("$ref").or_else(|| {
        schema
            .get("allOf")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 1)
            .and_then(|a| a[0].get("$ref"))
    });
    match reference.and_then(Value::as_str) {
        Some(r) => {
            let name = r.trim_start_matches("#/definitions/");
            (&root["definitions"][name], Some(name))
        }
        None => (schema, None),
    }
}

fn walk(root: &Value, schema: &Value, prefix: &str, values: &Value, out: &mut Vec<Row>) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (key, prop) in props {
        if key == LIBRARY || key == "global" {
            continue;
        }
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let (target, name) = resolve(root, prop);
        let description = prop
            .get("description")
            .or_else(|| target.get("description"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .split("\n\n")
            .next()
            .unwrap_or_default()
            .replace('\n', " ");
        let ours = name.is_none_or(|n| !n.starts_with("io.k8s."));
        if ours && target.get("properties").is_some() {
            walk(root, target, &path, &values[key], out);
            continue;
        }
        out.push(Row {
            key: path,
            type_: type_name(name, target),
            default: values.get(key).map(ToString::to_string),
            description,
        });
    }
}

fn type_name(name: Option<&str>, schema: &Value) -> String {
    if let Some(n) = name.and_then(|n| n.rsplit('.').next()) {
        return n.to_string();
    }
    if schema.get("enum").is_some() || schema.get("oneOf").is_some() {
        let values: Vec<String> = schema["enum"]
            .as_array()
            .cloned()
            .or_else(|| {
                schema["oneOf"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|o| o.get("const").cloned()).collect())
            })
            .unwrap_or_default()
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        return values.join(" \\| ");
    }
    match &schema["type"] {
        Value::String(t) if t == "array" => {
            let item = &schema["items"];
            let inner = item
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.rsplit(['.', '/']).next())
                .map(str::to_string)
                .or_else(|| item["type"].as_str().map(str::to_string))
                .unwrap_or_else(|| "object".into());
            format!("list of {inner}")
        }
        Value::String(t) if t == "object" => "map".into(),
        Value::String(t) => t.clone(),
        _ => "any".into(),
    }
}

/// The values table of a chart as Markdown.
pub fn table(rows: &[Row]) -> String {
    let mut out =
        String::from("| Key | Type | Default | Description |\n| --- | --- | --- | --- |\n");
    for r in rows {
        let default = r
            .default
            .as_deref()
            .map(|d| format!("`{}`", d.replace('|', "\\|")))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            r.key,
            r.type_,
            default,
            r.description.replace('|', "\\|")
        );
    }
    out
}

/// Marks the generated part of a chart's README.
pub const TABLE_BEGIN: &str =
    "<!-- values table: generated by `cargo run -p kubeairunway-config -- gen`; do not edit -->";
/// Ends the generated part.
pub const TABLE_END: &str = "<!-- end of values table -->";

/// `readme` with its values table replaced by `table`.
pub fn with_table(readme: &str, table: &str) -> anyhow::Result<String> {
    let (head, rest) = readme
        .split_once(TABLE_BEGIN)
        .ok_or_else(|| anyhow::anyhow!("the README has no line {TABLE_BEGIN}"))?;
    let (_, tail) = rest
        .split_once(TABLE_END)
        .ok_or_else(|| anyhow::anyhow!("the README has no line {TABLE_END}"))?;
    Ok(format!("{head}{TABLE_BEGIN}\n{table}{TABLE_END}{tail}"))
}
