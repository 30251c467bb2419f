//! ModelDeployments this provider no longer serves but still holds: when
//! `status.provider.name` moves to another provider (the user named another one), the
//! ModelDeployment leaves this provider's watch, so no reconcile would ever delete the
//! objects made for it or remove this provider's finalizer, and its deletion would hang.
//!
//! Such a ModelDeployment is noticed when it leaves the watch (a delete event while it
//! still carries our finalizer), and, for the ones that left while this replica was not
//! leading, by a sweep over the owned-object caches (objects labelled for a
//! ModelDeployment that is not among ours) at the start of every term and every resync
//! period. Each is read once from the API server (this is rare) and, if it is indeed
//! served by another provider now (or gone), released: its objects are deleted, then the
//! finalizer removed, with a `Released` event.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::events::EventType;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use tokio::sync::mpsc;

use super::cleanup::{delete_owned, release_finalizer};
use super::context::{Cached, Context};
use super::error::Error;
use crate::api::ModelDeployment;
use crate::provider::Provider;
use crate::reflect;

/// How long to wait before looking again at a ModelDeployment whose objects are still
/// being deleted.
const RETRY: Duration = Duration::from_secs(2);

/// Release every ModelDeployment sent on `requests`, and those a sweep finds.
pub(super) async fn run<P: Provider>(
    ctx: Arc<Context<P>>,
    mds: reflect::Cache<Cached>,
    mut requests: mpsc::UnboundedReceiver<(String, String)>,
) {
    if !mds.synced().await {
        return;
    }
    let mds = mds.store;
    let (retry_tx, mut retries) = mpsc::unbounded_channel::<(String, String)>();
    let mut sweep = tokio::time::interval(ctx.options.resync_period);
    loop {
        let batch: BTreeSet<(String, String)> = tokio::select! {
            _ = sweep.tick() => {
                // The caches of the owned kinds must have been filled for the sweep to see
                // anything: they are started by the term's readiness check.
                orphans(&ctx, &mds)
            }
            Some(one) = requests.recv() => BTreeSet::from([one]),
            Some(one) = retries.recv() => BTreeSet::from([one]),
            else => return,
        };
        for (ns, name) in batch {
            match release(&ctx, &mds, &ns, &name).await {
                Ok(true) => {}
                Ok(false) => {
                    let tx = retry_tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(RETRY).await;
                        let _ = tx.send((ns, name));
                    });
                }
                Err(e) => {
                    tracing::warn!(namespace = %ns, name = %name, error = %e, "releasing a ModelDeployment served by another provider");
                    let tx = retry_tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(crate::process::backoff(3)).await;
                        let _ = tx.send((ns, name));
                    });
                }
            }
        }
    }
}

/// ModelDeployments that own objects of ours but are not served by us (as the caches
/// see it).
fn orphans<P: Provider>(ctx: &Context<P>, mds: &Store<Cached>) -> BTreeSet<(String, String)> {
    ctx.owned
        .model_deployments()
        .into_iter()
        .filter(|(ns, name)| mds.get(&ObjectRef::new(name).within(ns)).is_none())
        .collect()
}

/// Release `ns/name` if it is not ours any more. `Ok(true)` when done (or nothing to do),
/// `Ok(false)` while its objects are still being deleted.
async fn release<P: Provider>(
    ctx: &Context<P>,
    mds: &Store<Cached>,
    ns: &str,
    name: &str,
) -> Result<bool, Error> {
    if mds.get(&ObjectRef::new(name).within(ns)).is_some() {
        return Ok(true); // ours after all
    }
    // Gone or another provider's: nothing to remember of it.
    ctx.memory.forget_named(ns, name);
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), ns);
    let Some(md) = api.get_opt(name).await? else {
        return Ok(true); // gone: the garbage collector removes what it owned
    };
    if md.selected_provider() == Some(ctx.name()) {
        return Ok(true); // ours: the watch has not caught up yet
    }
    let remaining = delete_owned(&md, ctx).await?;
    if !remaining.is_empty() {
        return Ok(false);
    }
    if md.finalizers().contains(&ctx.finalizer()) {
        release_finalizer(&md, ctx).await?;
        let now = md.selected_provider().unwrap_or("no provider");
        let message = format!(
            "{} released this ModelDeployment: it is served by {now} now",
            ctx.name()
        );
        ctx.event(&md, EventType::Normal, "Released", &message)
            .await;
        tracing::info!(namespace = %ns, name = %md.name_any(), uid = ?md.meta().uid, "released to another provider");
    }
    Ok(true)
}
