//! The provider runtime: all the I/O behind a [`Provider`].
//!
//! [`run`] registers the provider, follows its upstream kind as the API server serves it
//! (a CRD's, watched; a built-in one, by discovery and the OpenAPI v3 document), watches
//! the ModelDeployments it serves and every kind it renders, and reconciles each
//! ModelDeployment:
//!
//! 1. skip while paused (`kubeairunway.ai/reconcile-paused: "true"`);
//! 2. on deletion: delete the upstream objects, wait for them to go, and remove the
//!    finalizer `kubeairunway.ai/<name>-provider` (after `--finalizer-timeout` at the
//!    latest, with a `FinalizerTimeout` warning event);
//! 3. add the finalizer;
//! 4. `ProviderCompatible` from the capability fit ([`fit`]: the spec against the
//!    provider's registered capabilities), then [`Provider::check`], and from the served
//!    upstream API;
//! 5. render, check every rendered field path against the installed schema; with
//!    `spec.warmup`, stop here (reporting why) until its Warmup (named, or made by the
//!    runtime for an inline `spec.warmup`) is `Completed` (the warmup gate,
//!    `runtime/warmup.rs`); recreate the primary object when an
//!    identity field changed, report drift, and server-side-apply everything (field
//!    manager `<name>-provider`, forced);
//! 6. observe the live objects ([`crate::Live`]: every rendered object, by kind and
//!    name) and server-side-apply our status.
//!
//! Reads come from watch caches, never from the API server: the ModelDeployments this
//! provider serves (the controller's own reflector) and every object it owns
//! ([`cache`]); steady state costs no request at all. Writes happen only for what
//! changed: an object is applied only when what is rendered differs from what is live (or
//! the live object drifted), the status only when it differs from what is stored.
//!
//! Which ModelDeployments: a watch with the server-side field selector
//! `status.provider.name=<name>`. The ModelDeployment CRD declares
//! `.status.provider.name` as a selectable field, so the API server filters and each
//! provider only ever receives (and caches) its own objects, however many other
//! providers' objects the cluster holds. (A label would need core to write metadata as
//! well as status; a client-side filter would make every provider watch and cache every
//! ModelDeployment.)

mod cache;
pub mod fit;
mod memory;
mod metrics;
mod reconcile;
mod registration;
mod release;
mod status;
mod warmup;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use crate::events::{Recorder, Reporter};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{mpsc, watch};

use crate::api::ModelDeployment;
use crate::process::{self, Readiness, Runtime, Shutdown, Term};
use crate::provider::Provider;
use crate::reflect;
use crate::upstream::UpstreamApi;

pub use metrics::Metrics;
pub use reconcile::{Error, reconcile_once};

/// The provider runtime's flags (each also an environment variable), with the process
/// flags every binary shares ([`process::Options`]). Durations as `90s`, `5m`, `1h 30m`.
/// Its clap group has a name of its own: flattened together, two groups both named after
/// their struct (`Options`) make clap's debug assertions abort the binary at start.
#[derive(Clone, Debug, clap::Args)]
#[group(id = "ProviderRuntimeOptions")]
pub struct Options {
    /// Flags every binary shares: metrics address, log format, leader election.
    #[command(flatten)]
    pub process: process::Options,
    /// How long deletion waits for upstream objects to go before giving up.
    #[arg(long, env = "FINALIZER_TIMEOUT", default_value = "5m", value_parser = crate::process::parse_duration)]
    pub finalizer_timeout: Duration,
    /// How long the upstream status may stand still, while not Running, before the
    /// `StaleStatus` condition is set.
    #[arg(long, env = "STALE_STATUS_AFTER", default_value = "5m", value_parser = crate::process::parse_duration)]
    pub stale_status_after: Duration,
    /// How often the InferenceProviderConfig heartbeat is refreshed.
    #[arg(long, env = "HEARTBEAT_INTERVAL", default_value = "30s", value_parser = crate::process::parse_duration)]
    pub heartbeat_interval: Duration,
    /// How often every ModelDeployment is looked at again without any change (from the
    /// caches: it costs no API request unless something drifted).
    #[arg(long, env = "RESYNC_PERIOD", default_value = "5m", value_parser = crate::process::parse_duration)]
    pub resync_period: Duration,
    /// The cluster's DNS domain, for `status.url`
    /// (`http://<service>.<namespace>.svc.<domain>:<port>/v1`).
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            process: process::Options::default(),
            finalizer_timeout: Duration::from_secs(300),
            stale_status_after: Duration::from_secs(300),
            heartbeat_interval: Duration::from_secs(30),
            resync_period: Duration::from_secs(300),
            cluster_domain: "cluster.local".into(),
        }
    }
}

/// The detected upstream API: `None` while the API server does not serve the kind, `Err`
/// with the reason when no adapter fits it.
pub type UpstreamState = Option<Result<UpstreamApi, String>>;

/// Shared state of one provider's runtime, for one term of leadership.
pub struct Context<P: Provider> {
    pub(crate) provider: Arc<P>,
    pub(crate) client: Client,
    pub(crate) options: Options,
    pub(crate) upstream: watch::Receiver<UpstreamState>,
    pub(crate) recorder: Recorder,
    pub(crate) metrics: Arc<Metrics>,
    /// The objects this provider owns, from watch caches.
    pub(crate) owned: cache::OwnedCache,
    /// The Warmups of `spec.warmup` (named or made for an inline one), from a watch cache.
    pub(crate) warmups: warmup::Warmups,
    /// What is remembered of each ModelDeployment between reconciles.
    pub(crate) memory: memory::Memory,
}

impl<P: Provider> std::fmt::Debug for Context<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("provider", &self.provider.name())
            .finish_non_exhaustive()
    }
}

impl<P: Provider> Context<P> {
    /// A context for `provider` whose caches never fill: for driving single
    /// [`reconcile_once`] steps against a mock API in unit tests (every owned object
    /// reads as absent). `upstream` carries the detected upstream API.
    pub fn new(
        provider: Arc<P>,
        client: Client,
        options: Options,
        upstream: watch::Receiver<UpstreamState>,
    ) -> Self {
        let owned = cache::OwnedCache::new(client.clone(), provider.name(), None);
        let warmups = warmup::Warmups::new(client.clone(), None);
        Self::with_cache(
            provider,
            client,
            options,
            upstream,
            (owned, warmups),
            Arc::new(Metrics::new(
                &mut prometheus_client::registry::Registry::default(),
                "",
            )),
        )
    }

    /// This context with `objects` as the live objects it owns (instead of its caches),
    /// for single [`reconcile_once`] steps in unit tests. Objects are grouped by their
    /// `apiVersion` and kind (the plural guessed from the kind); pass the upstream
    /// objects with the [`UpstreamApi::api_resource`] of their kind through
    /// [`Context::with_live_of`] when the guess is wrong.
    #[must_use]
    pub fn with_live(self, objects: Vec<kube::api::DynamicObject>) -> Self {
        let mut by_kind: HashMap<(String, String), Vec<kube::api::DynamicObject>> = HashMap::new();
        for o in objects {
            let t = o.types.clone().unwrap_or_default();
            by_kind.entry((t.api_version, t.kind)).or_default().push(o);
        }
        let mut ctx = self;
        for ((api_version, kind), objects) in by_kind {
            let (group, version) = api_version
                .rsplit_once('/')
                .unwrap_or(("", api_version.as_str()));
            let resource = kube::discovery::ApiResource::from_gvk(
                &kube::core::GroupVersionKind::gvk(group, version, &kind),
            );
            ctx = ctx.with_live_of(&resource, objects);
        }
        ctx
    }

    /// This context with `objects` as the live objects of `resource` it owns.
    #[must_use]
    pub fn with_live_of(
        self,
        resource: &kube::discovery::ApiResource,
        objects: Vec<kube::api::DynamicObject>,
    ) -> Self {
        self.owned.fixed(resource, objects);
        self
    }

    /// This context with `warmups` (`cache.kubeairunway.ai/v1alpha1` Warmups) as the
    /// Warmups `spec.warmup` can name, for single [`reconcile_once`] steps in unit tests.
    #[must_use]
    pub fn with_warmups(self, warmups: Vec<kube::api::DynamicObject>) -> Self {
        self.warmups.fixed(warmups);
        self
    }

    fn with_cache(
        provider: Arc<P>,
        client: Client,
        options: Options,
        upstream: watch::Receiver<UpstreamState>,
        (owned, warmups): (cache::OwnedCache, warmup::Warmups),
        metrics: Arc<Metrics>,
    ) -> Self {
        let reporter = Reporter {
            controller: field_manager(provider.name()),
            instance: Some(options.process.identity(&field_manager(provider.name()))),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            metrics,
            provider,
            client,
            options,
            upstream,
            owned,
            warmups,
            memory: memory::Memory::default(),
        }
    }

    pub(crate) fn name(&self) -> &str {
        self.provider.name()
    }

    pub(crate) fn field_manager(&self) -> String {
        field_manager(self.name())
    }

    pub(crate) fn finalizer(&self) -> String {
        finalizer(self.name())
    }
}

/// The field manager of a provider: `<name>-provider`.
pub fn field_manager(provider: &str) -> String {
    format!("{provider}-provider")
}

/// The finalizer of a provider: `kubeairunway.ai/<name>-provider`.
pub fn finalizer(provider: &str) -> String {
    format!("kubeairunway.ai/{provider}-provider")
}

/// Parse flags and environment, start the process runtime (logging, client, signals,
/// endpoints) and [`run`] until SIGTERM or Ctrl-C. The whole `main` of a provider binary
/// without flags of its own:
///
/// ```no_run
/// # async fn example(my_provider: impl kubeairunway_sdk::Provider) -> anyhow::Result<()> {
/// // in `#[tokio::main] async fn main() -> anyhow::Result<()>`:
/// kubeairunway_sdk::runtime::main(my_provider).await
/// # }
/// ```
pub async fn main<P: Provider>(provider: P) -> anyhow::Result<()> {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        options: Options,
    }
    let options = Cli::parse().options;
    let rt = Runtime::start(&field_manager(provider.name()), options.process.clone()).await?;
    run(provider, rt, options).await
}

/// Run `provider` on the process runtime `rt` until the process stops.
///
/// The upstream API detection and the endpoints run on every replica; the writers (the
/// heartbeat and the ModelDeployment controller) only while this replica leads (always,
/// without `--leader-elect`).
pub async fn run<P: Provider>(
    provider: P,
    mut rt: Runtime,
    options: Options,
) -> anyhow::Result<()> {
    let provider = Arc::new(provider);
    let metrics = Arc::new(Metrics::new(rt.registry(), provider.name()));
    let (upstream_tx, upstream_rx) = watch::channel::<UpstreamState>(None);
    let name = provider.name().to_string();
    tracing::info!(provider = %name, "starting provider runtime");
    let crd_watch = tokio::spawn(registration::watch_upstream(
        provider.clone(),
        rt.client(),
        options.clone(),
        upstream_tx,
    ));
    let gauge = tokio::spawn(metrics::follow_upstream(
        metrics.clone(),
        upstream_rx.clone(),
    ));
    let readiness = rt.readiness();
    let client = rt.client();
    let result = rt
        .run(|term| {
            lead(
                provider.clone(),
                client.clone(),
                options.clone(),
                upstream_rx.clone(),
                metrics.clone(),
                readiness.clone(),
                term,
            )
        })
        .await;
    crd_watch.abort();
    gauge.abort();
    tracing::info!(provider = %name, "provider runtime stopped");
    result
}

/// Run `provider` on `client` until `shutdown` completes (tests and in-process use:
/// logging is left as it is).
pub async fn run_until<P: Provider>(
    provider: P,
    client: Client,
    options: Options,
    shutdown: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
) -> anyhow::Result<()> {
    let shutdown = Shutdown::on(async move {
        if let Err(e) = shutdown.await {
            tracing::warn!(error = %e, "shutdown signal failed");
        }
    });
    let rt = Runtime::with_client(
        &field_manager(provider.name()),
        options.process.clone(),
        client,
        shutdown,
    );
    run(provider, rt, options).await
}

/// What, of a ModelDeployment, can change what this provider does: its generation (spec,
/// deletion), labels, annotations (pause), finalizers other than `ours` and the selected
/// provider. Status writes (ours, core's, the kernel cache's) change none of it and wake
/// no reconcile; nor does adding our own finalizer, the first write of a first reconcile:
/// the reconcile it would wake could read the store before that reconcile's status write
/// arrives and write the same status again. (Someone removing our finalizer is noticed on
/// the next reconcile, and deleting the ModelDeployment sets its deletion timestamp.)
fn reconcile_relevant(md: &Cached, ours: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    md.meta().generation.hash(&mut h);
    md.meta().deletion_timestamp.is_some().hash(&mut h);
    md.meta().labels.hash(&mut h);
    let (annotations, selected_provider) = md.annotations_and_selected_provider();
    annotations.hash(&mut h);
    md.finalizers()
        .iter()
        .filter(|f| f.as_str() != ours)
        .for_each(|f| f.hash(&mut h));
    selected_provider.hash(&mut h);
    md.uid().hash(&mut h);
    h.finish()
}

/// A ModelDeployment as the runtime caches it: metadata parsed, the rest as JSON text,
/// parsed when a reconcile reads it ([`crate::compact`]).
pub(crate) type Cached = crate::compact::Compact<ModelDeployment>;

/// One term of leadership: the heartbeat, the caches and the ModelDeployment controller,
/// until the term ends.
async fn lead<P: Provider>(
    provider: Arc<P>,
    client: Client,
    options: Options,
    upstream: watch::Receiver<UpstreamState>,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    term: Term,
) -> anyhow::Result<()> {
    let name = provider.name().to_string();
    let synced = readiness.term_check("caches");
    // Reconcile nothing before the upstream API has been looked for once: until then
    // "not served" would be a guess.
    // Every wait of a term ends with the term: cut off from the API server, the first
    // detection may never come, and a term stuck here outlived its Lease (until the
    // process runtime's `TERM_GRACE` watchdog cancelled it).
    let mut detected = upstream.clone();
    if !detected.has_changed().unwrap_or(true) {
        tokio::select! {
            _ = detected.changed() => {}
            () = term.ended() => return Ok(()),
        }
    }
    let (owned_tx, owned_rx) = mpsc::unbounded_channel::<ObjectRef<ModelDeployment>>();
    let warmups = warmup::Warmups::new(client.clone(), Some(owned_tx.clone()));
    let owned = cache::OwnedCache::new(client.clone(), &name, Some(owned_tx));
    let ctx = Arc::new(Context::with_cache(
        provider.clone(),
        client.clone(),
        options.clone(),
        upstream.clone(),
        (owned, warmups),
        metrics,
    ));
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(registration::heartbeat(
        provider.clone(),
        client.clone(),
        options.clone(),
        upstream.clone(),
    ));

    // The ModelDeployments this provider serves: a reflector of our own (stripped), whose
    // events reach the controller only when something relevant changed; one that leaves
    // the selection while still holding our finalizer is released (its objects deleted,
    // the finalizer removed).
    let (release_tx, release_rx) = mpsc::unbounded_channel::<(String, String)>();
    let selector = format!("status.provider.name={name}");
    let finalizer_name = finalizer(&name);
    let (mds, stream) = reflect::compact_cache(
        Api::<ModelDeployment>::all(client.clone()),
        watcher::Config::default().fields(&selector).any_semantic(),
        (),
        reflect::strip,
    );
    let stream = stream
        .inspect(move |event| {
            if let Ok(watcher::Event::Delete(md)) = event
                && md.finalizers().contains(&finalizer_name)
                && let Some(ns) = md.namespace()
            {
                let _ = release_tx.send((ns, md.name_any()));
            }
        })
        .applied_objects()
        .predicate_filter(
            {
                let ours = finalizer(&name);
                move |md: &Cached| Some(reconcile_relevant(md, &ours))
            },
            PredicateConfig::default(),
        );
    tasks.spawn(release::run(ctx.clone(), mds.clone(), release_rx));
    tasks.spawn(mark_synced(ctx.clone(), mds.clone(), synced));

    let controller = Controller::for_stream(stream, mds.store.clone())
        .with_config(crate::process::controller_config())
        .reconcile_on(receiver_stream(owned_rx).map(|r| {
            let mut cached = ObjectRef::<Cached>::new(&r.name);
            cached.namespace = r.namespace;
            cached
        }))
        .reconcile_all_on(upstream_changes(upstream))
        .graceful_shutdown_on({
            let term = term.clone();
            async move { term.ended().await }
        })
        .run(
            reconcile::reconcile::<P>,
            reconcile::error_policy::<P>,
            ctx.clone(),
        )
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile loop");
            }
        });
    tokio::select! {
        () = controller => {}
        () = reflect::ended_unsynced(&mds, term.ended()) => {
            tracing::info!(provider = %name, "the term ended before the ModelDeployment cache synced; its controller is dropped");
        }
    }
    tasks.abort_all();
    Ok(())
}

/// Set `synced` once the ModelDeployment cache and the caches of the upstream kind and
/// the provider's other kinds have been filled.
async fn mark_synced<P: Provider>(
    ctx: Arc<Context<P>>,
    mds: reflect::Cache<Cached>,
    synced: process::Check,
) {
    if !mds.synced().await {
        return;
    }
    let mut upstream = ctx.upstream.clone();
    loop {
        let kinds = owned_kinds(&ctx, upstream.borrow_and_update().as_ref());
        let mut all = true;
        for kind in &kinds {
            all &= ctx.owned.synced(kind).await;
        }
        if all {
            synced.set();
        }
        if upstream.changed().await.is_err() {
            return;
        }
    }
}

/// The kinds the provider may own objects of: the detected upstream kind and
/// [`Provider::owned_kinds`].
pub(crate) fn owned_kinds<P: Provider>(
    ctx: &Context<P>,
    upstream: Option<&Result<UpstreamApi, String>>,
) -> Vec<kube::discovery::ApiResource> {
    let mut kinds = ctx.provider.owned_kinds();
    if let Some(Ok(api)) = upstream {
        kinds.insert(0, api.api_resource());
    }
    kinds
}

/// One item each time the detected upstream API changes.
fn upstream_changes(
    rx: watch::Receiver<UpstreamState>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok().map(|()| ((), rx))
    })
}

fn receiver_stream<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A provider that renders nothing, for unit tests that drive single steps of the
/// runtime.
#[cfg(test)]
pub(crate) struct Nothing;

#[cfg(test)]
impl crate::Provider for Nothing {
    fn name(&self) -> &'static str {
        "nothing"
    }
    fn config(&self) -> crate::InferenceProviderConfigSpec {
        crate::InferenceProviderConfigSpec::default()
    }
    fn upstream(&self) -> crate::provider::UpstreamRef {
        crate::provider::UpstreamRef::new("example.com", "Widget", "widgets", &["v1"])
    }
    fn render(
        &self,
        _: &crate::ModelDeployment,
        _: &crate::UpstreamApi,
    ) -> Result<crate::Rendered, crate::RenderError> {
        Ok(crate::Rendered::default())
    }
    fn observe(&self, _: &crate::ModelDeployment, _: &crate::Live) -> crate::Observed {
        crate::Observed::deploying("")
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    /// A provider binary's command line: the runtime's flags and its own.
    #[derive(Debug, Parser)]
    #[command(name = "some-provider", version)]
    struct Cli {
        #[command(flatten)]
        options: super::Options,
        #[arg(long, default_value = "x")]
        own: String,
    }

    #[test]
    fn a_provider_command_line_passes_clap_s_own_checks_and_parses() {
        // The checks clap runs (debug builds) when a binary parses its first argument.
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["some-provider", "--cluster-domain=corp.example"]).unwrap();
        assert_eq!(cli.options.cluster_domain, "corp.example");
        assert_eq!(cli.own, "x");
    }

    /// Run one term of `lead` against an API server that never answers, with `upstream`
    /// as the detected upstream API; end the term
    /// after `before_end`; whether `lead` returned within `TERM_GRACE` of the end. Time is
    /// paused: were `lead` still waiting, the runtime would advance to the timeout.
    async fn term_returns(
        upstream: Option<super::UpstreamState>,
        before_end: std::time::Duration,
    ) -> bool {
        // An API server that never answers (no TLS provider is chosen in unit tests of
        // the whole workspace, so no real client is built here).
        let (service, _never_answered) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = kube::Client::new(service, "default");
        let (detect, detected) = tokio::sync::watch::channel(None);
        if let Some(state) = upstream {
            detect.send_replace(state);
        }
        let (leading, lost) = tokio::sync::watch::channel(true);
        let term = crate::process::Term::new(lost, super::Shutdown::on(std::future::pending()));
        let metrics = std::sync::Arc::new(super::Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
            "nothing",
        ));
        let running = tokio::spawn(super::lead(
            std::sync::Arc::new(super::Nothing),
            client,
            super::Options::default(),
            detected,
            metrics,
            super::Readiness::default(),
            term,
        ));
        tokio::time::sleep(before_end).await;
        leading.send(false).unwrap();
        let returned = tokio::time::timeout(crate::process::TERM_GRACE, running).await;
        drop(detect);
        matches!(returned, Ok(Ok(Ok(()))))
    }

    /// The API server unreachable since the start: the upstream API is never detected,
    /// and the term's end still ends `lead`.
    #[tokio::test(start_paused = true)]
    async fn a_term_that_ends_before_the_first_detection_returns() {
        assert!(term_returns(None, std::time::Duration::from_secs(1)).await);
    }

    /// The API server unreachable after the detection: the ModelDeployment cache never
    /// syncs, and the term's end still ends `lead` (kube's graceful shutdown alone would
    /// wait for the store forever).
    #[tokio::test(start_paused = true)]
    async fn a_term_that_ends_before_its_cache_synced_returns() {
        let not_served = Some(Err("not served".to_string()));
        assert!(term_returns(Some(not_served), std::time::Duration::from_secs(1)).await);
    }

    #[test]
    fn only_changes_that_matter_wake_a_reconcile_and_our_own_finalizer_does_not() {
        let ours = super::finalizer("p");
        let md: crate::api::ModelDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns", "generation": 1, "uid": "u"},
            "spec": {"model": {"id": "a/b"}},
        }))
        .unwrap();
        let key = |md: &crate::api::ModelDeployment| {
            super::reconcile_relevant(&super::Cached::new(md.clone()).unwrap(), &ours)
        };
        let mut changed = md.clone();
        changed.metadata.finalizers = Some(vec![ours.clone()]);
        assert_eq!(key(&changed), key(&md), "adding our finalizer");
        changed.status = Some(crate::api::ModelDeploymentStatus {
            message: Some("written".into()),
            ..Default::default()
        });
        assert_eq!(key(&changed), key(&md), "a status write");
        let mut other = md.clone();
        other.metadata.finalizers = Some(vec!["someone.else/cleanup".into()]);
        assert_ne!(key(&other), key(&md), "another finalizer");
        let mut spec = md.clone();
        spec.metadata.generation = Some(2);
        assert_ne!(key(&spec), key(&md), "a spec change");
        let mut paused = md.clone();
        paused.metadata.annotations =
            Some([("kubeairunway.ai/reconcile-paused".into(), "true".into())].into());
        assert_ne!(key(&paused), key(&md), "an annotation");
    }
}
