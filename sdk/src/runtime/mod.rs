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
//!    runtime for an inline `spec.warmup`) is `Completed` (the warmup gate, decided in
//!    `runtime/gate.rs`); recreate the primary object when an
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
mod cleanup;
mod context;
mod delete;
mod drift;
mod error;
pub mod fit;
#[cfg(test)]
mod fixtures;
mod gate;
mod memory;
mod metrics;
mod reconcile;
mod registration;
mod release;
mod status;
#[cfg(test)]
mod testing;
mod view;
mod warmup;
mod warmups;

use std::hash::{Hash, Hasher};
use std::sync::Arc;

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

pub use crate::upstream::UpstreamState;
pub use context::{Context, Options, field_manager, finalizer};
pub use error::Error;
pub use metrics::Metrics;
pub use reconcile::reconcile_once;

use context::{Cached, owned_kinds};

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

/// A provider binary's command line: the provider runtime's flags (with the process
/// runtime's) and the provider's own, `F` (see [`main_with`]).
#[derive(Debug, clap::Parser)]
#[command(version)]
pub struct Cli<F: clap::Args> {
    /// The provider runtime's flags.
    #[command(flatten)]
    pub options: Options,
    /// The provider's own flags.
    #[command(flatten)]
    pub flags: F,
}

/// A provider's own flags, and the provider they configure (see [`main_with`]).
pub trait ProviderFlags: clap::Args + Send + Sync + 'static {
    /// The provider these flags configure.
    type Provider: Provider;
    /// What `--help` says the binary does.
    const ABOUT: &'static str;
    /// The provider these flags configure, on `client`'s cluster (most providers read
    /// nothing of it; KAITO looks for its InferenceSet CRD).
    fn provider_for(
        &self,
        client: &Client,
    ) -> impl std::future::Future<Output = anyhow::Result<Self::Provider>> + Send;
}

/// The whole `main` of a provider binary named `binary` with flags of its own (`F`):
/// the command line and environment parsed ([`Cli`]), the process runtime started, and
/// the provider `F` configures [`run`] until SIGTERM or Ctrl-C.
///
/// ```no_run
/// use kubeairunway_sdk::runtime::ProviderFlags;
/// # use kubeairunway_sdk::{InferenceProviderConfigSpec, Live, ModelDeployment, Observed};
/// # use kubeairunway_sdk::{Provider, RenderError, Rendered, UpstreamApi, UpstreamRef};
/// # struct Mine { image: String }
/// # impl Provider for Mine {
/// #     fn name(&self) -> &str { "mine" }
/// #     fn config(&self) -> InferenceProviderConfigSpec { InferenceProviderConfigSpec::default() }
/// #     fn upstream(&self) -> UpstreamRef { UpstreamRef::new("apps", "Deployment", "deployments", &["v1"]) }
/// #     fn render(&self, _: &ModelDeployment, _: &UpstreamApi) -> Result<Rendered, RenderError> { Ok(Rendered::default()) }
/// #     fn observe(&self, _: &ModelDeployment, _: &Live) -> Observed { Observed::deploying("") }
/// # }
///
/// /// My provider's own flags (each also an environment variable).
/// #[derive(clap::Args)]
/// struct Flags {
///     /// The serving image.
///     #[arg(long, env = "IMAGE", default_value = "vllm/vllm-openai:v0.11.0")]
///     image: String,
/// }
///
/// impl ProviderFlags for Flags {
///     type Provider = Mine;
///     const ABOUT: &'static str = "serves ModelDeployments with my provider";
///
///     async fn provider_for(&self, _: &kube::Client) -> anyhow::Result<Mine> {
///         Ok(Mine { image: self.image.clone() })
///     }
/// }
///
/// #[tokio::main]
/// async fn main() -> anyhow::Result<()> {
///     kubeairunway_sdk::runtime::main_with::<Flags>("my-provider").await
/// }
/// ```
pub async fn main_with<F: ProviderFlags>(binary: &'static str) -> anyhow::Result<()> {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::<F>::command()
        .name(binary)
        .about(F::ABOUT)
        .get_matches();
    let cli = Cli::<F>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let rt = Runtime::start(binary, cli.options.process.clone()).await?;
    let provider = cli.flags.provider_for(&rt.client()).await?;
    run(provider, rt, cli.options).await
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
    let warmups = warmups::Warmups::new(client.clone(), Some(owned_tx.clone()));
    let owned =
        cache::OwnedCache::new(client.clone(), &name, Some(owned_tx)).ending_with(term.clone());
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
    let selector = ModelDeployment::selected_for(&name);
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
            all &= matches!(ctx.owned.synced(kind).await, Ok(true));
        }
        if all {
            synced.set();
        }
        if upstream.changed().await.is_err() {
            return;
        }
    }
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
            std::sync::Arc::new(super::testing::Nothing),
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
