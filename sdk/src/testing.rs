//! Test helpers for provider authors (feature `testing`).
//!
//! - [`ModelDeploymentBuilder`]: ModelDeployments in a line or two.
//! - [`cluster`]: a real Kubernetes API server (etcd + the upstream apiserver code: CRDs,
//!   the built-in kinds the platform uses, webhook admission) with the platform's CRDs
//!   installed, and [`spawn`] to run a provider against it in-process.
//! - [`select`]: set `status.provider.name` and the reason the way core does: explicit
//!   when the ModelDeployment names the provider, otherwise scored by its rules
//!   ([`core_selection`] is the same decision as a pure function).
//! - [`score`]: which provider core would choose for a ModelDeployment that names none,
//!   among registrations you give it: core's own pure selection, without a cluster, to
//!   test your CEL selection rules against ours.
//! - [`write_upstream_status`]: play the upstream operator, writing the upstream
//!   object's status the way it does (and nothing else).
//! - [`mock`]: a tower-test mock API server for unit tests of single reconcile steps.
//! - [`wait_for`]: poll an object until a condition holds; [`md_where`],
//!   [`object_where`] and [`event_where`] do it for ModelDeployments, upstream objects and
//!   events, panicking with what they saw when time runs out (they are for tests).
//! - [`overrides::check_overrides`]: a property test of a provider's
//!   `spec.provider.overrides` parsing (random documented keys, values and typos).
//! - [`private_cluster`]: a cluster of the test's own, for tests that install a specific
//!   upstream CRD version or run a provider (two instances of one provider on a shared
//!   cluster would serve the same ModelDeployments).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::{Client, Resource};
use serde_json::json;

use crate::api::{EngineType, ModelDeployment, ModelDeploymentSpec, ServingMode};
use crate::conditions::{self, PROVIDER_SELECTED, reasons};
use crate::provider::Provider;
use crate::runtime::{self, Options};

pub mod overrides;

pub use kubeairunway_testcluster::{TestCluster, ensure_namespace, install_crds, shared};

/// Field manager of core, as [`select`] uses it.
pub const CORE_MANAGER: &str = crate::CORE_FIELD_MANAGER;
/// Field manager [`write_upstream_status`] uses.
pub const UPSTREAM_FIXTURE_MANAGER: &str = "upstream-operator-fixture";

/// Builds a [`ModelDeployment`].
#[derive(Clone, Debug)]
pub struct ModelDeploymentBuilder {
    md: ModelDeployment,
}

impl ModelDeploymentBuilder {
    /// A ModelDeployment named `name` in `default`, serving `Qwen/Qwen2.5-0.5B-Instruct`
    /// with vLLM on one GPU.
    pub fn new(name: &str) -> Self {
        let mut md = ModelDeployment::new(name, ModelDeploymentSpec::default());
        md.metadata.namespace = Some("default".to_string());
        let b = Self { md };
        b.model("Qwen/Qwen2.5-0.5B-Instruct")
            .engine(EngineType::Vllm)
            .gpus(1)
    }

    /// Namespace.
    pub fn namespace(mut self, ns: &str) -> Self {
        self.md.metadata.namespace = Some(ns.to_string());
        self
    }

    /// Hugging Face model id.
    pub fn model(mut self, id: &str) -> Self {
        self.md.spec.model.id = Some(id.to_string());
        self
    }

    /// Engine type.
    pub fn engine(mut self, engine: EngineType) -> Self {
        self.md.spec.engine.type_ = Some(engine);
        self
    }

    /// GPUs per replica (0 is CPU-only).
    pub fn gpus(mut self, count: i32) -> Self {
        let resources = self.md.spec.resources.get_or_insert_with(Default::default);
        resources.gpu = Some(crate::api::GpuSpec {
            count,
            ..Default::default()
        });
        self
    }

    /// Replicas.
    pub fn replicas(mut self, replicas: i32) -> Self {
        self.md.spec.scaling.replicas = replicas;
        self
    }

    /// Serving mode.
    pub fn mode(mut self, mode: ServingMode) -> Self {
        self.md.spec.serving.mode = mode;
        self
    }

    /// Name a provider in the spec.
    pub fn provider(mut self, name: &str) -> Self {
        self.md
            .spec
            .provider
            .get_or_insert_with(Default::default)
            .name = Some(name.to_string());
        self
    }

    /// `provider.overrides` (a JSON object).
    pub fn overrides(mut self, overrides: serde_json::Value) -> Self {
        if let serde_json::Value::Object(map) = overrides {
            self.md
                .spec
                .provider
                .get_or_insert_with(Default::default)
                .overrides = Some(map);
        }
        self
    }

    /// Custom image.
    pub fn image(mut self, image: &str) -> Self {
        self.md.spec.image = Some(image.to_string());
        self
    }

    /// A label on the ModelDeployment itself.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.md
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Change the spec directly.
    pub fn spec(mut self, f: impl FnOnce(&mut ModelDeploymentSpec)) -> Self {
        f(&mut self.md.spec);
        self
    }

    /// The ModelDeployment.
    pub fn build(self) -> ModelDeployment {
        self.md
    }
}

/// The shared test cluster of this process with the platform's CRDs installed, and a
/// client for the caller. The server also serves the built-in kinds a provider may render
/// or read: `apps/v1` Deployments, StatefulSets, DaemonSets and ReplicaSets, `batch/v1`
/// Jobs, Services, ConfigMaps, Secrets, ServiceAccounts, PersistentVolumeClaims and
/// PersistentVolumes, Pods, Events, Leases, RBAC, HorizontalPodAutoscalers and
/// PodDisruptionBudgets. No controller of them runs: a test plays the one it needs with
/// [`write_upstream_status`].
pub async fn cluster() -> anyhow::Result<(&'static TestCluster, Client)> {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let cluster = shared();
    INSTALLED
        .get_or_try_init(|| async {
            let client = cluster.client().await?;
            install_crds(&client, &crate::api::crds::all()).await
        })
        .await?;
    Ok((cluster, cluster.client().await?))
}

/// Runtime options for tests: short heartbeat, stale and finalizer timings, no metrics
/// server.
pub fn test_options() -> Options {
    Options {
        process: crate::process::Options {
            metrics_bind_address: String::new(),
            log_format: crate::process::LogFormat::Text,
            ..crate::process::Options::default()
        },
        finalizer_timeout: Duration::from_secs(5),
        stale_status_after: Duration::from_secs(3),
        heartbeat_interval: Duration::from_secs(1),
        resync_period: Duration::from_secs(2),
        cluster_domain: "cluster.local".into(),
    }
}

/// A provider running in-process; stopped when dropped.
#[derive(Debug)]
pub struct RunningProvider {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RunningProvider {
    /// Stop the provider and wait for it to finish.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await?
    }
}

impl Drop for RunningProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Run `provider` against `client` in a task of the current runtime.
pub fn spawn<P: Provider>(provider: P, client: Client, options: Options) -> RunningProvider {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(runtime::run_until(provider, client, options, async move {
        let _ = stopped.await;
        Ok(())
    }));
    RunningProvider {
        stop: Some(stop),
        task,
    }
}

/// How long the `*_where` helpers wait.
pub const WAIT: Duration = Duration::from_secs(60);

/// A cluster of the caller's own (stopped when dropped) with the platform's CRDs and
/// `extra` CRDs installed, and a client. `tag` names its run directory.
pub async fn private_cluster(
    tag: &str,
    extra: &[k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition],
) -> anyhow::Result<(TestCluster, Client)> {
    let dir = kubeairunway_testcluster::cache_dir()
        .join("runs")
        .join(format!("{}-{tag}", std::process::id()));
    let cluster = tokio::task::spawn_blocking(move || {
        TestCluster::start(&dir, kubeairunway_testcluster::Lifetime::TiedToProcess)
    })
    .await??;
    let client = cluster.client().await?;
    let mut crds = crate::api::crds::all();
    crds.extend(extra.iter().cloned());
    install_crds(&client, &crds).await?;
    Ok((cluster, client))
}

/// Create or update the ModelDeployment as a user would (server-side apply of its spec as
/// `user`), then [`select`] `provider` as core would.
pub async fn deploy(
    client: &Client,
    md: &ModelDeployment,
    provider: &str,
) -> kube::Result<ModelDeployment> {
    let ns = md.metadata.namespace.as_deref().unwrap_or("default");
    // As a user would, into a namespace that exists (NamespaceLifecycle refuses others).
    kubeairunway_testcluster::ensure_namespace(client, ns)
        .await
        .map_err(|e| kube::Error::Service(e.into()))?;
    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), ns);
    let mut body = serde_json::to_value(md).map_err(kube::Error::SerdeError)?;
    if let Some(obj) = body.as_object_mut() {
        obj.remove("status");
    }
    let name = md.metadata.name.clone().unwrap_or_default();
    let created = api
        .patch(
            &name,
            &PatchParams::apply("user").force(),
            &Patch::Apply(&body),
        )
        .await?;
    select(client, &created, provider).await
}

/// Wait until the ModelDeployment satisfies `ready`; panics after [`WAIT`] with the last
/// state seen.
pub async fn md_where(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    ready: impl Fn(&ModelDeployment) -> bool,
) -> ModelDeployment {
    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), ns);
    wait_for(WAIT, what, || api.get(name), ready)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Wait until provider `name` is registered and ready (its InferenceProviderConfig says
/// `status.ready: true`); panics after [`WAIT`]. Core selects among the providers it has
/// seen registered, so a test that lets core choose waits for every candidate first.
pub async fn registered(client: &Client, name: &str) -> crate::api::InferenceProviderConfig {
    let api: Api<crate::api::InferenceProviderConfig> = Api::all(client.clone());
    wait_for(
        WAIT,
        &format!("provider {name} registered and ready"),
        || api.get(name),
        |c| c.status.as_ref().is_some_and(|s| s.ready == Some(true)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Wait until the object (`None` while absent) satisfies `ready`; panics after [`WAIT`].
pub async fn object_where(
    client: &Client,
    resource: &ApiResource,
    ns: &str,
    name: &str,
    what: &str,
    ready: impl Fn(&Option<DynamicObject>) -> bool,
) -> Option<DynamicObject> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
    wait_for(WAIT, what, || api.get_opt(name), ready)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn events_resource() -> ApiResource {
    ApiResource {
        group: "events.k8s.io".into(),
        version: "v1".into(),
        api_version: "events.k8s.io/v1".into(),
        kind: "Event".into(),
        plural: "events".into(),
    }
}

/// Notes of the events with `reason` about the object named `regarding` in `ns`.
pub async fn events(
    client: &Client,
    ns: &str,
    regarding: &str,
    reason: &str,
) -> kube::Result<Vec<String>> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &events_resource());
    Ok(api
        .list(&kube::api::ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.data["regarding"]["name"] == regarding && e.data["reason"] == reason)
        .map(|e| e.data["note"].as_str().unwrap_or_default().to_string())
        .collect())
}

/// Wait for at least one event with `reason` about `regarding`; panics after [`WAIT`]
/// listing the events that did arrive.
pub async fn event_where(client: &Client, ns: &str, regarding: &str, reason: &str) -> Vec<String> {
    let found = wait_for(
        WAIT,
        &format!("a {reason} event"),
        || events(client, ns, regarding, reason),
        |e: &Vec<String>| !e.is_empty(),
    )
    .await;
    match found {
        Ok(notes) => notes,
        Err(e) => {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), ns, &events_resource());
            let all: Vec<String> = api
                .list(&kube::api::ListParams::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .map(|e| {
                            format!(
                                "{}/{}: {}",
                                e.data["regarding"]["name"], e.data["reason"], e.data["note"]
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            panic!("{e}; events in {ns}: {all:?}");
        }
    }
}

/// The phase of a ModelDeployment.
pub fn phase(md: &ModelDeployment) -> Option<crate::api::Phase> {
    md.status.as_ref().and_then(|s| s.phase)
}

/// The status message of a ModelDeployment (empty when unset).
pub fn message(md: &ModelDeployment) -> String {
    md.status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default()
}

/// A condition of a ModelDeployment.
pub fn condition<'a>(
    md: &'a ModelDeployment,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    md.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, type_))
}

/// What core writes when it selects a provider for a ModelDeployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreSelection {
    /// `status.provider.name`.
    pub provider: String,
    /// The `ProviderSelected=True` condition's reason: `ExplicitSelection` for a provider
    /// named in `spec.provider.name`, `AutoSelected` for one chosen by its rules.
    pub reason: &'static str,
    /// `status.provider.selectedReason`, also the condition's message: core's own text
    /// ([`crate::selection::EXPLICIT_REASON`], or the capabilities and the winning rule).
    pub selected_reason: String,
}

/// What core writes when it selects `provider`, registered with `config`, for `md`: a
/// pure function, as core decides.
///
/// - `md` names `provider` in `spec.provider.name`: explicit selection (core requires
///   only that the provider is registered and serves a model);
/// - `md` names no provider: `provider` is scored as core scores it
///   ([`crate::selection::evaluate`] and [`crate::selection::decide`]), taken as ready
///   with a fresh heartbeat, and the reason is the one core writes when it wins (which
///   it does among the registered providers when no other scores higher: test that with
///   [`score`]).
///
/// `Err` says why core would not select it: `md` names another provider, the provider
/// serves no model, its capabilities do not fit, or none of its rules is true.
pub fn core_selection(
    md: &ModelDeployment,
    provider: &str,
    config: &crate::InferenceProviderConfigSpec,
) -> Result<CoreSelection, String> {
    if !config.serves() {
        return Err(format!(
            "provider {provider} registers no engines: it serves no model"
        ));
    }
    if let Some(named) = md.spec.provider_name() {
        if named != provider {
            return Err(format!(
                "spec.provider.name is {named}: core selects {named}, not {provider}"
            ));
        }
        return Ok(CoreSelection {
            provider: provider.to_string(),
            reason: reasons::EXPLICIT,
            selected_reason: crate::selection::EXPLICIT_REASON.to_string(),
        });
    }
    match score(md, &[(provider, config.clone())]).outcome {
        crate::selection::Outcome::Selected {
            provider, reason, ..
        } => Ok(CoreSelection {
            provider,
            reason: reasons::AUTO_SELECTED,
            selected_reason: reason,
        }),
        crate::selection::Outcome::NoneFits { message } => Err(message),
        crate::selection::Outcome::NoHealthyProviders { detail } => Err(detail),
    }
}

/// Select `provider` for the ModelDeployment as core does, once the provider has
/// registered (its InferenceProviderConfig exists; waited for up to [`WAIT`]): apply
/// `status.provider.name`, `selectedReason` and `ProviderSelected=True` under core's
/// field manager, with the reason core writes ([`core_selection`]: `ExplicitSelection`
/// when `spec.provider.name` names it, otherwise `AutoSelected` with the rule that
/// matched). Fails, writing nothing, when core would not select it (then name it in
/// `spec.provider.name`, as a user would).
pub async fn select(
    client: &Client,
    md: &ModelDeployment,
    provider: &str,
) -> kube::Result<ModelDeployment> {
    let refused = |why: String| kube::Error::Service(why.into());
    let ns = md
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    let name = md.metadata.name.clone().unwrap_or_default();
    let configs: Api<crate::InferenceProviderConfig> = Api::all(client.clone());
    let config = wait_for(
        WAIT,
        &format!("provider {provider} to register"),
        || configs.get_opt(provider),
        Option::is_some,
    )
    .await
    .map_err(|e| refused(e.to_string()))?
    .ok_or_else(|| refused(format!("provider {provider} is not registered")))?;
    let chosen = core_selection(md, provider, &config.spec)
        .map_err(|why| refused(format!("core would not select {provider}: {why}")))?;
    // With no engine in the spec, the engine core records: the first `provider` serves.
    let engine = if md.spec.engine.type_.is_none() {
        let mut named = md.clone();
        named.spec.provider.get_or_insert_default().name = Some(provider.to_string());
        let choice = crate::engine_choice::choose_engine(
            &named,
            &[std::sync::Arc::new(config.clone())],
            &crate::selection::RuleCache::default(),
            &crate::selection::Settings::default(),
            Timestamp::now(),
        );
        let engine = choice.engine().ok_or_else(|| refused(choice.to_string()))?;
        Some(json!({"type": engine, "selectedReason": choice.reason()}))
    } else {
        None
    };
    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    let condition = conditions::new(
        None,
        PROVIDER_SELECTED,
        true,
        chosen.reason,
        chosen.selected_reason.clone(),
        md.metadata.generation,
        Timestamp::now(),
    );
    let mut patch = json!({
        "apiVersion": ModelDeployment::api_version(&()),
        "kind": "ModelDeployment",
        "status": {
            "provider": {"name": chosen.provider, "selectedReason": chosen.selected_reason},
            "conditions": [condition],
        },
    });
    if let Some(engine) = engine {
        patch["status"]["engine"] = engine;
    }
    api.patch_status(
        &name,
        &PatchParams::apply(CORE_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
}

/// Which provider core would select for `md` (which names none) among `providers`, each
/// a provider's name and registration ([`Provider::config`]), every one taken as ready
/// with a fresh heartbeat: [`crate::selection::select`], as core runs it (over the engine
/// [`crate::engine_choice::choose_engine`] chooses when the spec names none).
pub fn score(
    md: &ModelDeployment,
    providers: &[(&str, crate::InferenceProviderConfigSpec)],
) -> crate::selection::Selection {
    let now = Timestamp::now();
    let configs: Vec<std::sync::Arc<crate::InferenceProviderConfig>> = providers
        .iter()
        .map(|(name, spec)| {
            let mut config = crate::InferenceProviderConfig::new(name, spec.clone());
            config.metadata.generation = Some(1);
            config.status = Some(crate::InferenceProviderConfigStatus {
                ready: Some(true),
                last_heartbeat: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
                ..Default::default()
            });
            std::sync::Arc::new(config)
        })
        .collect();
    let (rules, settings) = (
        crate::selection::RuleCache::default(),
        crate::selection::Settings::default(),
    );
    let choice = crate::engine_choice::choose_engine(md, &configs, &rules, &settings, now);
    let resolved = match (md.spec.engine.type_, choice.engine()) {
        (None, Some(engine)) => crate::engine_choice::with_engine(md, engine),
        _ => md.clone(),
    };
    crate::selection::select(&resolved, &configs, &rules, &settings, now)
}

/// Write an upstream object's `status` as its operator would (a merge patch of the status
/// subresource, under the fixture's own field manager).
pub async fn write_upstream_status(
    client: &Client,
    resource: &ApiResource,
    namespace: &str,
    name: &str,
    status: serde_json::Value,
) -> kube::Result<DynamicObject> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    let pp = PatchParams {
        field_manager: Some(UPSTREAM_FIXTURE_MANAGER.to_string()),
        ..PatchParams::default()
    };
    api.patch_status(name, &pp, &Patch::Merge(&json!({ "status": status })))
        .await
}

/// Poll `get` every 100 ms until `ready` holds for its value; fail after `timeout` with the
/// last value seen.
pub async fn wait_for<T: std::fmt::Debug, F, Fut>(
    timeout: Duration,
    what: &str,
    mut get: F,
    ready: impl Fn(&T) -> bool,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = kube::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = get().await;
        if let Ok(v) = &last
            && ready(v)
        {
            return last.map_err(Into::into);
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}; last: {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A mock API server for unit tests of single reconcile steps, on `tower-test`.
pub mod mock {
    use http::{Request, Response};
    use kube::Client;
    use kube::client::Body;

    /// The server side of a mock client: answer its requests one by one.
    #[derive(Debug)]
    pub struct ApiServer(tower_test::mock::Handle<Request<Body>, Response<Body>>);

    /// A client whose every request is answered by the returned [`ApiServer`].
    pub fn pair() -> (Client, ApiServer) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        (Client::new(service, "default"), ApiServer(handle))
    }

    impl ApiServer {
        /// Take the next request, check it with `check` (method, path and query, body),
        /// and answer with `status` and `body`.
        pub async fn answer(
            &mut self,
            check: impl FnOnce(&http::Method, &str, &serde_json::Value),
            status: u16,
            body: serde_json::Value,
        ) -> anyhow::Result<()> {
            self.respond(|method, uri, sent| {
                check(method, uri, sent);
                (status, body)
            })
            .await
        }

        /// Take the next request and answer it with the status and body `reply` computes
        /// from its method, path and query, and body. Fails when the client is gone.
        pub async fn respond(
            &mut self,
            reply: impl FnOnce(&http::Method, &str, &serde_json::Value) -> (u16, serde_json::Value),
        ) -> anyhow::Result<()> {
            let (request, send) = self
                .0
                .next_request()
                .await
                .ok_or_else(|| anyhow::anyhow!("no request came"))?;
            let method = request.method().clone();
            let uri = request.uri().to_string();
            let bytes = request.into_body().collect_bytes().await?;
            let sent: serde_json::Value = if bytes.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::from_slice(&bytes)?
            };
            let (status, body) = reply(&method, &uri, &sent);
            let response = Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&body)?))?;
            send.send_response(response);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Capabilities, EngineCapability, InferenceProviderConfigSpec, SelectionRule};

    fn registration(rules: &[(&str, i32)]) -> InferenceProviderConfigSpec {
        InferenceProviderConfigSpec {
            capabilities: Some(Capabilities::serving([EngineCapability::new(
                EngineType::Vllm,
            )
            .serving_modes([ServingMode::Aggregated])
            .gpu(true)])),
            selection_rules: rules
                .iter()
                .map(|(condition, priority)| SelectionRule {
                    condition: (*condition).to_string(),
                    priority: *priority,
                })
                .collect(),
            ..InferenceProviderConfigSpec::default()
        }
    }

    #[test]
    fn a_named_provider_is_an_explicit_selection() {
        let md = ModelDeploymentBuilder::new("m").provider("mine").build();
        assert_eq!(
            core_selection(&md, "mine", &registration(&[])),
            Ok(CoreSelection {
                provider: "mine".into(),
                reason: reasons::EXPLICIT,
                selected_reason: crate::selection::EXPLICIT_REASON.into(),
            })
        );
        let err = core_selection(&md, "other", &registration(&[])).unwrap_err();
        assert_eq!(
            err,
            "spec.provider.name is mine: core selects mine, not other"
        );
    }

    #[test]
    fn an_unnamed_provider_is_scored_with_core_s_reason() {
        let md = ModelDeploymentBuilder::new("m").build();
        let chosen = core_selection(
            &md,
            "mine",
            &registration(&[("false", 90), ("spec.engine.type == 'vllm'", 20)]),
        )
        .unwrap();
        assert_eq!(chosen.reason, reasons::AUTO_SELECTED);
        assert_eq!(
            chosen.selected_reason,
            "matched capabilities: engine=vllm, gpu=true, mode=aggregated; rule `spec.engine.type == 'vllm'` priority 20"
        );
        let err = core_selection(&md, "mine", &registration(&[])).unwrap_err();
        assert!(
            err.ends_with("mine: no selection rules (explicit selection only)"),
            "{err}"
        );
        let cpu = ModelDeploymentBuilder::new("m").gpus(0).build();
        let err = core_selection(&cpu, "mine", &registration(&[("true", 1)])).unwrap_err();
        assert!(
            err.ends_with("mine: CPU-only not supported with vllm"),
            "{err}"
        );
    }

    /// A spec with no engine is scored over the engine core would choose.
    #[test]
    fn a_spec_without_an_engine_is_scored_over_the_chosen_engine() {
        let mut md = ModelDeploymentBuilder::new("m").build();
        md.spec.engine.type_ = None;
        md.spec.resources = None;
        let chosen = core_selection(&md, "mine", &registration(&[("true", 1)])).unwrap();
        assert_eq!(
            chosen.selected_reason,
            "matched capabilities: engine=vllm, gpu=true, mode=aggregated; rule `true` priority 1"
        );
    }

    #[test]
    fn a_provider_that_serves_no_model_is_never_selected() {
        let md = ModelDeploymentBuilder::new("m").provider("cache").build();
        let err =
            core_selection(&md, "cache", &InferenceProviderConfigSpec::default()).unwrap_err();
        assert_eq!(
            err,
            "provider cache registers no engines: it serves no model"
        );
    }
}
