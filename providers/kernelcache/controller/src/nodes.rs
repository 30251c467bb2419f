//! The controller of Nodes' ready labels, from the agents' KernelCacheNode reports (the
//! agents never write Nodes).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
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
use crate::labels;
use crate::metrics::Metrics;
use crate::settings::SYNC_WAIT;
use kubeairunway_kernelcache_api::report::Error;

/// The controller of Nodes' ready labels from the agents' reports (a part of [`crate::run`];
/// the agents never write Nodes).
pub(crate) fn label_controller(
    ctx: &Ctx,
    node_meta: &Cache<PartialObjectMeta<Node>>,
    node_meta_stream: impl futures::Stream<Item = Result<PartialObjectMeta<Node>, watcher::Error>>
    + Send
    + 'static,
    reports: impl futures::Stream<Item = KernelCacheNode> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl std::future::Future<Output = ()> {
    // Each report's node, from the reports' own reflector (its store is what the
    // reconcile reads).
    let report_nodes = reports.map(|n| ObjectRef::new(&n.name_any()));
    let label_ctx = Arc::new(LabelCtx {
        client: ctx.client.clone(),
        reports: ctx.nodes.clone(),
        metrics: Arc::clone(&ctx.metrics),
    });
    Controller::for_stream(node_meta_stream, node_meta.store.clone())
        .with_config(kubeairunway_sdk::process::controller_config())
        .reconcile_on(report_nodes)
        .graceful_shutdown_on(shutdown)
        .run(reconcile_node_labels, label_error, label_ctx)
        .for_each(|_| async {})
}

struct LabelCtx {
    client: Client,
    reports: Cache<KernelCacheNode>,
    metrics: Arc<Metrics>,
}

#[allow(clippy::needless_pass_by_value)] // kube-runtime's error-policy signature
fn label_error(_: Arc<PartialObjectMeta<Node>>, error: &Error, _: Arc<LabelCtx>) -> Action {
    warn!(%error, "setting a node's kernel-cache labels");
    Action::requeue(Duration::from_secs(10))
}

/// Make a Node's ready labels match its KernelCacheNode report ([`labels`]).
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
    Ok(Action::await_change())
}
