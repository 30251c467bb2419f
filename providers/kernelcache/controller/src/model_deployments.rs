//! The controller of `KernelCacheReady` on the ModelDeployments that name a cache: cache
//! changes wake the ModelDeployments of their namespace that name them.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::compact::Compact;
use kubeairunway_sdk::conditions::{self, KERNEL_CACHE_READY};
use kubeairunway_sdk::reflect::Cache;
use serde_json::json;
use tracing::warn;

use kubeairunway_kernelcache_api::KernelCache;

use crate::caches::Ctx;
use crate::decide;
use crate::metrics::Metrics;
use crate::settings::SYNC_WAIT;
use kubeairunway_kernelcache_api::names::PROVIDER_FIELD_MANAGER;
use kubeairunway_kernelcache_api::report::Error;

/// The controller of `KernelCacheReady` on ModelDeployments (a part of [`crate::run`]): cache
/// changes wake the ModelDeployments in their namespace that name them.
pub(crate) fn md_controller(
    ctx: &Ctx,
    mds: &Cache<Compact<ModelDeployment>>,
    md_stream: impl futures::Stream<Item = Result<Compact<ModelDeployment>, watcher::Error>>
    + Send
    + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl std::future::Future<Output = ()> {
    let md_store = mds.store.clone();
    let cache_mds = move |cache: KernelCache| {
        let (ns, name) = (cache.namespace().unwrap_or_default(), cache.name_any());
        md_store
            .state()
            .iter()
            .filter(|md| md.namespace().as_deref() == Some(ns.as_str()))
            .filter(|md| md.kernel_cache_name().as_deref() == Some(name.as_str()))
            .map(|md| ObjectRef::from_obj(md.as_ref()))
            .collect::<Vec<_>>()
    };
    let md_ctx = Arc::new(MdCtx {
        client: ctx.client.clone(),
        caches: ctx.caches.clone(),
        metrics: Arc::clone(&ctx.metrics),
    });
    Controller::for_stream(md_stream, mds.store.clone())
        .with_config(kubeairunway_sdk::process::controller_config())
        .watches(
            Api::<KernelCache>::all(ctx.client.clone()),
            watcher::Config::default(),
            cache_mds,
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile_md, md_error, md_ctx)
        .for_each(|_| async {})
}

/// What [`reconcile_md`] reads of a ModelDeployment, hashed: its identity and the
/// KernelCache it names, and for one naming a cache, its generation and its
/// `KernelCacheReady` condition. Its other changes (core's and the serving provider's
/// status, their finalizers) never change what it decides, so they wake nothing: one
/// reconcile per ModelDeployment naming no cache, not one per write to it. Cache changes
/// wake the ModelDeployments naming them through the KernelCache watch.
pub(crate) fn md_relevant(md: &Compact<ModelDeployment>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    md.meta().uid.hash(&mut h);
    let cache = md.kernel_cache_name();
    cache.hash(&mut h);
    if cache.is_some() {
        md.meta().generation.hash(&mut h);
        let condition = md
            .status()
            .and_then(|s| conditions::find(&s.conditions, KERNEL_CACHE_READY).cloned());
        serde_json::to_string(&condition).ok().hash(&mut h);
    }
    h.finish()
}

struct MdCtx {
    client: Client,
    caches: Cache<KernelCache>,
    metrics: Arc<Metrics>,
}

#[allow(clippy::needless_pass_by_value)] // kube-runtime's error-policy signature
fn md_error(_: Arc<Compact<ModelDeployment>>, error: &Error, _: Arc<MdCtx>) -> Action {
    warn!(%error, "writing KernelCacheReady");
    Action::requeue(Duration::from_secs(10))
}

/// `KernelCacheReady` on one ModelDeployment that names a cache.
async fn reconcile_md(
    cached: Arc<Compact<ModelDeployment>>,
    ctx: Arc<MdCtx>,
) -> Result<Action, Error> {
    let _timing = ctx.metrics.reconciling("ModelDeployment");
    let Some(name) = cached.kernel_cache_name() else {
        return Ok(Action::await_change());
    };
    let name = name.as_str();
    let md = cached.object()?;
    // An empty cache store would report every cache missing after a restart.
    if !ctx.caches.synced_within(SYNC_WAIT).await {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let ns = md.namespace().unwrap_or_default();
    let cache = ctx.caches.store.get(&ObjectRef::new(name).within(&ns));
    let (ok, reason, message) = decide::model_deployment_condition(name, cache.as_deref());
    let current = md
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let previous = conditions::find(current, KERNEL_CACHE_READY);
    let condition: Condition = conditions::new(
        previous,
        KERNEL_CACHE_READY,
        ok,
        reason,
        message,
        md.metadata.generation,
        k8s_openapi::jiff::Timestamp::now(),
    );
    if previous == Some(&condition) {
        return Ok(Action::await_change());
    }
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    let status = json!({"conditions": [condition]});
    kubeairunway_kernelcache_api::report::apply(
        &api,
        &md.name_any(),
        PROVIDER_FIELD_MANAGER,
        &status,
    )
    .await?;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use kubeairunway_sdk::api::{KernelCacheRef, ModelDeploymentStatus};
    use kubeairunway_sdk::testing::ModelDeploymentBuilder;

    use super::*;

    fn relevant(md: &ModelDeployment) -> u64 {
        md_relevant(&Compact::new(md.clone()).unwrap())
    }

    fn with_condition(md: &ModelDeployment, type_: &str, ok: bool) -> ModelDeployment {
        let mut md = md.clone();
        let status = md.status.get_or_insert_with(ModelDeploymentStatus::default);
        status.conditions.push(conditions::new(
            None,
            type_,
            ok,
            "Reason",
            "message",
            Some(1),
            Timestamp::UNIX_EPOCH,
        ));
        md
    }

    /// Others' writes (core's and the serving provider's status, finalizers) wake nothing;
    /// what the condition is decided from, and the condition itself, do.
    #[test]
    fn only_what_decides_kernel_cache_ready_wakes_a_model_deployment() {
        let mut plain = ModelDeploymentBuilder::new("m").namespace("ns").build();
        plain.metadata.uid = Some("u1".into());
        plain.metadata.generation = Some(1);
        let mut written_by_others = with_condition(&plain, "Ready", false);
        written_by_others.metadata.finalizers = Some(vec!["kubeairunway.ai/x".into()]);
        written_by_others.metadata.generation = Some(2);
        // Naming no cache: nothing but its identity and a cache's name count.
        assert_eq!(relevant(&plain), relevant(&written_by_others));
        let mut recreated = plain.clone();
        recreated.metadata.uid = Some("u2".into());
        assert_ne!(relevant(&plain), relevant(&recreated));

        let mut named = plain.clone();
        named.spec.kernel_cache = Some(KernelCacheRef { name: "c".into() });
        assert_ne!(relevant(&plain), relevant(&named));
        assert_eq!(
            relevant(&named),
            relevant(&with_condition(&named, "Ready", true))
        );
        let mut edited = named.clone();
        edited.metadata.generation = Some(2);
        assert_ne!(relevant(&named), relevant(&edited));
        let ours = with_condition(&named, KERNEL_CACHE_READY, true);
        assert_ne!(relevant(&named), relevant(&ours));
        assert_ne!(
            relevant(&ours),
            relevant(&with_condition(&named, KERNEL_CACHE_READY, false))
        );
    }
}
