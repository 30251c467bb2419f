//! The controller of `KernelCacheReady` and `ModelCacheReady` on ModelDeployments: a
//! KernelCache's change wakes the ModelDeployments of its namespace that name it, a
//! ModelCache's those that use it or name it.

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
use kubeairunway_sdk::conditions::{self, KERNEL_CACHE_READY, MODEL_CACHE_READY};
use kubeairunway_sdk::reflect::Cache;
use serde_json::json;
use tracing::warn;

use kubeairunway_kernelcache_api::KernelCache;
use kubeairunway_kernelcache_api::model::{ModelCache, model_uses};

use crate::caches::Ctx;
use crate::metrics::Metrics;
use crate::settings::SYNC_WAIT;
use crate::{decide, model_decide};
use kubeairunway_kernelcache_api::names::PROVIDER_FIELD_MANAGER;
use kubeairunway_kernelcache_api::report::Error;

/// The controller of `KernelCacheReady` and `ModelCacheReady` on ModelDeployments (a
/// part of [`crate::run`]): cache changes wake the ModelDeployments in their namespace that
/// name them (a ModelCache's also those whose model it holds).
pub(crate) fn md_controller(
    ctx: &Ctx,
    mds: &Cache<Compact<ModelDeployment>>,
    md_stream: impl futures::Stream<Item = Result<Compact<ModelDeployment>, watcher::Error>>
    + Send
    + 'static,
    models: &Cache<ModelCache>,
    model_stream: impl futures::Stream<Item = ModelCache> + Send + 'static,
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
    let md_store = mds.store.clone();
    let model_mds = move |cache: ModelCache| {
        let (ns, name) = (cache.namespace().unwrap_or_default(), cache.name_any());
        md_store
            .state()
            .iter()
            .filter(|md| md.namespace().as_deref() == Some(ns.as_str()))
            .filter(|md| {
                md.model()
                    .is_some_and(|model| model_uses(&model, &name, &cache.spec))
            })
            .map(|md| ObjectRef::from_obj(md.as_ref()))
            .collect::<Vec<_>>()
    };
    let md_ctx = Arc::new(MdCtx {
        client: ctx.client.clone(),
        caches: ctx.caches.clone(),
        models: models.clone(),
        metrics: Arc::clone(&ctx.metrics),
    });
    Controller::for_stream(md_stream, mds.store.clone())
        .with_config(kubeairunway_sdk::process::controller_config())
        .watches(
            Api::<KernelCache>::all(ctx.client.clone()),
            watcher::Config::default(),
            cache_mds,
        )
        .watches_stream(model_stream.map(Ok), model_mds)
        .graceful_shutdown_on(shutdown)
        .run(reconcile_md, md_error, md_ctx)
        .for_each(|_| async {})
}

/// What [`reconcile_md`] reads of a ModelDeployment, hashed: its identity, the KernelCache
/// it names, its model (id, source, the ModelCache it names), our two conditions, and its
/// generation (our conditions' `observedGeneration`) once it names a kernel cache or has
/// a `ModelCacheReady`. Its other changes (core's and the serving provider's status, their
/// finalizers) never change what it decides, so they wake nothing: one reconcile per
/// ModelDeployment no cache concerns, not one per write to it. Cache changes wake the
/// ModelDeployments they concern through the cache watches.
pub(crate) fn md_relevant(md: &Compact<ModelDeployment>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    md.meta().uid.hash(&mut h);
    let cache = md.kernel_cache_name();
    cache.hash(&mut h);
    serde_json::to_string(&md.model()).ok().hash(&mut h);
    let (kernel, model_condition) = (
        md.condition(KERNEL_CACHE_READY),
        md.condition(MODEL_CACHE_READY),
    );
    if cache.is_some() || model_condition.is_some() {
        md.meta().generation.hash(&mut h);
    }
    serde_json::to_string(&kernel).ok().hash(&mut h);
    serde_json::to_string(&model_condition).ok().hash(&mut h);
    h.finish()
}

struct MdCtx {
    client: Client,
    caches: Cache<KernelCache>,
    models: Cache<ModelCache>,
    metrics: Arc<Metrics>,
}

#[allow(clippy::needless_pass_by_value)] // kube-runtime's error-policy signature
fn md_error(_: Arc<Compact<ModelDeployment>>, error: &Error, _: Arc<MdCtx>) -> Action {
    warn!(%error, "writing KernelCacheReady and ModelCacheReady");
    Action::requeue(Duration::from_secs(10))
}

/// `KernelCacheReady` and `ModelCacheReady` on one ModelDeployment: each where a cache
/// concerns it, applied together (one field manager owns both: an entry left out of an
/// apply is removed, which is how a condition no cache concerns any longer goes).
async fn reconcile_md(
    cached: Arc<Compact<ModelDeployment>>,
    ctx: Arc<MdCtx>,
) -> Result<Action, Error> {
    let _timing = ctx.metrics.reconciling("ModelDeployment");
    let md = cached.object()?;
    // An empty cache store would report every cache missing after a restart.
    if !ctx.caches.synced_within(SYNC_WAIT).await || !ctx.models.synced_within(SYNC_WAIT).await {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let ns = md.namespace().unwrap_or_default();
    let mut decided = Vec::new();
    if let Some(name) = cached.kernel_cache_name() {
        let cache = ctx.caches.store.get(&ObjectRef::new(&name).within(&ns));
        let (ok, reason, message) = decide::model_deployment_condition(&name, cache.as_deref());
        decided.push((KERNEL_CACHE_READY, ok, reason, message));
    }
    let models: Vec<Arc<ModelCache>> = ctx
        .models
        .store
        .state()
        .into_iter()
        .filter(|c| c.namespace().as_deref() == Some(ns.as_str()))
        .collect();
    if let Some((ok, reason, message)) =
        model_decide::model_deployment_condition(&md.spec.model, &models)
    {
        decided.push((MODEL_CACHE_READY, ok, reason, message));
    }
    let current = md
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now();
    let wanted: Vec<Condition> = decided
        .into_iter()
        .map(|(type_, ok, reason, message)| {
            let previous = conditions::find(current, type_);
            conditions::new(
                previous,
                type_,
                ok,
                reason,
                message,
                md.metadata.generation,
                now,
            )
        })
        .collect();
    let unchanged = [KERNEL_CACHE_READY, MODEL_CACHE_READY]
        .iter()
        .all(|type_| conditions::find(current, type_) == wanted.iter().find(|c| c.type_ == *type_));
    if unchanged {
        return Ok(Action::await_change());
    }
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    let status = json!({"conditions": wanted});
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
        // Its model, and our ModelCacheReady, count; with the condition, so does the
        // generation (the condition's observedGeneration).
        let mut other_model = plain.clone();
        other_model.spec.model.id = Some("org/other".into());
        assert_ne!(relevant(&plain), relevant(&other_model));
        let with_model_condition = with_condition(&plain, MODEL_CACHE_READY, true);
        assert_ne!(relevant(&plain), relevant(&with_model_condition));
        let mut later = with_model_condition.clone();
        later.metadata.generation = Some(5);
        assert_ne!(relevant(&with_model_condition), relevant(&later));
        let ours = with_condition(&named, KERNEL_CACHE_READY, true);
        assert_ne!(relevant(&named), relevant(&ours));
        assert_ne!(
            relevant(&ours),
            relevant(&with_condition(&named, KERNEL_CACHE_READY, false))
        );
    }
}
