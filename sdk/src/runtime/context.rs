//! What one provider's runtime shares between reconciles, for one term of leadership
//! ([`Context`]), and the runtime's flags ([`Options`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::discovery::ApiResource;
use kube::{Client, Resource};
use tokio::sync::watch;

use super::cache;
use super::memory;
use super::metrics::Metrics;
use super::warmups::Warmups;
use crate::api::{ModelDeployment, Warmup};
use crate::events::{Event, EventType, Recorder, Reporter};
use crate::process;
use crate::provider::Provider;
use crate::upstream::{UpstreamApi, UpstreamState};

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
    pub(crate) warmups: Warmups,
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
    /// [`reconcile_once`](super::reconcile_once) steps against a mock API in unit tests (every owned object
    /// reads as absent). `upstream` carries the detected upstream API.
    pub fn new(
        provider: Arc<P>,
        client: Client,
        options: Options,
        upstream: watch::Receiver<UpstreamState>,
    ) -> Self {
        let owned = cache::OwnedCache::new(client.clone(), provider.name(), None);
        let warmups = Warmups::new(client.clone(), None);
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
    /// for single [`reconcile_once`](super::reconcile_once) steps in unit tests. Objects are grouped by their
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

    /// This context with `warmups` as the Warmups `spec.warmup` can name, for single
    /// [`reconcile_once`](super::reconcile_once) steps in unit tests.
    #[must_use]
    pub fn with_warmups(self, warmups: Vec<Warmup>) -> Self {
        self.warmups.fixed(warmups);
        self
    }

    pub(crate) fn with_cache(
        provider: Arc<P>,
        client: Client,
        options: Options,
        upstream: watch::Receiver<UpstreamState>,
        (owned, warmups): (cache::OwnedCache, Warmups),
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

    /// Publish an event about `md`; failures are logged, never fatal. Whether it was
    /// written.
    pub(crate) async fn event(
        &self,
        md: &ModelDeployment,
        type_: EventType,
        reason: &str,
        note: &str,
    ) -> bool {
        let ev = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note.chars().take(1024).collect()),
            action: "Reconcile".to_string(),
            secondary: None,
        };
        match self.recorder.publish(&ev, &md.object_ref(&())).await {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, reason, "could not publish event");
                false
            }
        }
    }
}

/// The field manager of a provider: `<name>-provider`.
pub fn field_manager(provider: &str) -> String {
    format!("{provider}-provider")
}

/// The finalizer of a provider: `kubeairunway.ai/<name>-provider`.
pub fn finalizer(provider: &str) -> String {
    crate::finalizers::of_provider(provider)
}

/// A ModelDeployment as the runtime caches it: metadata parsed, the rest as JSON text,
/// parsed when a reconcile reads it ([`crate::compact`]).
pub(crate) type Cached = crate::compact::Compact<ModelDeployment>;

/// The kinds the provider may own objects of: the detected upstream kind and
/// [`Provider::owned_kinds`].
pub(crate) fn owned_kinds<P: Provider>(
    ctx: &Context<P>,
    upstream: Option<&Result<UpstreamApi, String>>,
) -> Vec<ApiResource> {
    let mut kinds = ctx.provider.owned_kinds();
    if let Some(Ok(api)) = upstream {
        kinds.insert(0, api.api_resource());
    }
    kinds
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider binary's flags (the provider runtime's, which hold the process
    /// runtime's) pass clap's own consistency checks, which abort a debug build at start.
    #[test]
    fn provider_flags_pass_clap_checks() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Binary {
            #[command(flatten)]
            options: Options,
        }
        Binary::command().debug_assert();
    }
}
