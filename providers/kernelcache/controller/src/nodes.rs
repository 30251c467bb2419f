//! The controller of Nodes' ready labels, from the agents' KernelCacheNode reports (the
//! agents never write Nodes), and of the caches in use on each node, recorded in its
//! KernelCacheNode from the serving pods there ([`crate::in_use`]).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kubeairunway_sdk::reflect::Cache;
use tracing::{info, warn};

use kubeairunway_kernelcache_api::KernelCacheNode;

use crate::caches::Ctx;
use crate::metrics::Metrics;
use crate::settings::FIELD_MANAGER;
use crate::settings::SYNC_WAIT;
use crate::{in_use, labels};
use kubeairunway_kernelcache_api::report::Error;

/// The controller of Nodes' ready labels from the agents' reports, and of the caches in
/// use on each node from its pods (a part of [`crate::run`]; the agents never write Nodes
/// nor read pods).
pub(crate) fn label_controller(
    ctx: &Ctx,
    (node_meta, node_meta_stream): (
        &Cache<PartialObjectMeta<Node>>,
        impl futures::Stream<Item = Result<PartialObjectMeta<Node>, watcher::Error>> + Send + 'static,
    ),
    reports: impl futures::Stream<Item = KernelCacheNode> + Send + 'static,
    (pods, pod_stream): (
        &Cache<Pod>,
        impl futures::Stream<Item = Result<Pod, watcher::Error>> + Send + 'static,
    ),
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl std::future::Future<Output = ()> {
    // Each report's node, from the reports' own reflector (its store is what the
    // reconcile reads); each pod's node, after the pods' store has it.
    let report_nodes = reports.map(|n| ObjectRef::new(&n.name_any()));
    let pod_nodes = pod_stream.filter_map(|p| {
        futures::future::ready(
            p.ok()
                .and_then(|p| p.spec.and_then(|s| s.node_name))
                .map(|n| ObjectRef::new(&n)),
        )
    });
    let label_ctx = Arc::new(LabelCtx {
        client: ctx.client.clone(),
        reports: ctx.nodes.clone(),
        pods: pods.clone(),
        metrics: Arc::clone(&ctx.metrics),
    });
    Controller::for_stream(node_meta_stream, node_meta.store.clone())
        .with_config(kubeairunway_sdk::process::controller_config())
        .reconcile_on(report_nodes)
        .reconcile_on(pod_nodes)
        .graceful_shutdown_on(shutdown)
        .run(reconcile_node_labels, label_error, label_ctx)
        .for_each(|_| async {})
}

struct LabelCtx {
    client: Client,
    reports: Cache<KernelCacheNode>,
    pods: Cache<Pod>,
    metrics: Arc<Metrics>,
}

#[allow(clippy::needless_pass_by_value)] // kube-runtime's error-policy signature
fn label_error(_: Arc<PartialObjectMeta<Node>>, error: &Error, _: Arc<LabelCtx>) -> Action {
    warn!(%error, "setting a node's kernel-cache labels");
    Action::requeue(Duration::from_secs(10))
}

/// Make a Node's ready labels match its KernelCacheNode report ([`labels`]), and record
/// the caches in use there in the report ([`record_in_use`]).
async fn reconcile_node_labels(
    node: Arc<PartialObjectMeta<Node>>,
    ctx: Arc<LabelCtx>,
) -> Result<Action, Error> {
    let _timing = ctx.metrics.reconciling("Node");
    // An empty store would take every label away after a restart.
    if !ctx.reports.synced_within(SYNC_WAIT).await {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let name = node.name_any();
    let report = ctx.reports.store.get(&ObjectRef::new(&name));
    let ready = labels::ready_labels(report.as_deref());
    let changes = labels::label_changes(node.labels(), &ready);
    if !changes.is_empty() {
        info!(node = %name, set = ?changes.set, remove = ?changes.remove, "labelling the node");
        Api::<Node>::all(ctx.client.clone())
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(changes.merge_patch()),
            )
            .await?;
    }
    if let Some(report) = report {
        // An empty store would say no cache is in use, and the agent could evict one.
        if !ctx.pods.synced_within(SYNC_WAIT).await {
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
        record_in_use(&ctx, &report).await?;
    }
    Ok(Action::await_change())
}

/// Record in the KernelCacheNode `report` the caches the pods on its node use
/// ([`in_use::on_node`]), when that changed (server-side apply of `spec.inUse` only).
async fn record_in_use(ctx: &LabelCtx, report: &KernelCacheNode) -> Result<(), Error> {
    let name = report.name_any();
    let pods = ctx.pods.store.state();
    let in_use = in_use::on_node(pods.iter().map(AsRef::as_ref), &name);
    if report.spec.in_use.as_ref() == Some(&in_use) {
        return Ok(());
    }
    info!(node = %name, ?in_use, "recording the kernel caches in use");
    Api::<KernelCacheNode>::all(ctx.client.clone())
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(in_use::apply_body(&name, &in_use)),
        )
        .await?;
    Ok(())
}
