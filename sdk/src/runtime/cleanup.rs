//! The finalizer and the deletion of what a provider made: its finalizer added before
//! anything is applied; on deletion, every object it owns deleted (as read), waited for,
//! and the finalizer removed (after `--finalizer-timeout` at the latest); objects no
//! longer rendered pruned.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use kube::runtime::controller::Action;

use super::context::{Context, owned_kinds};
use super::delete::{DELETE_POLL, delete_as_read};
use super::error::Error;
use super::status;
use super::view::ProviderView;
use super::warmup;
use crate::api::{ModelDeployment, Phase};
use crate::events::EventType;
use crate::finalizers;
use crate::provider::Provider;
use crate::render::owned_by;

/// Add this provider's finalizer to `md` (before anything is applied).
pub(crate) async fn ensure_finalizer<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Result<(), Error> {
    let Some(finalizers) = finalizers::with(md, &ctx.finalizer()) else {
        return Ok(());
    };
    finalizers::replace(&api_of(md, ctx), md, &finalizers).await?;
    Ok(())
}

fn api_of<P: Provider>(md: &ModelDeployment, ctx: &Context<P>) -> Api<ModelDeployment> {
    Api::namespaced(ctx.client.clone(), &md.namespace().unwrap_or_default())
}

/// Deletion: delete our objects, wait until they are gone, then release the
/// ModelDeployment; give up after the finalizer timeout.
pub(crate) async fn cleanup<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Result<Action, Error> {
    let finalizer = ctx.finalizer();
    if !md.finalizers().contains(&finalizer) {
        return Ok(Action::await_change());
    }
    // The status write changes the resourceVersion that guards the finalizer patch: go
    // on with the object it returned, or the patch would fail with a conflict.
    let written = status::apply(
        ctx,
        md,
        &ProviderView::new(Phase::Terminating, "deleting the provider's resources"),
    )
    .await
    .ok()
    .flatten();
    let md = written.as_ref().unwrap_or(md);
    let mut remaining = delete_owned(md, ctx).await?;
    remaining.extend(warmup::release(md, ctx).await?);
    if remaining.is_empty() {
        release_finalizer(md, ctx).await?;
        return Ok(Action::await_change());
    }
    let deleting_since = md
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    let waited =
        Duration::try_from(Timestamp::now().duration_since(deleting_since)).unwrap_or_default();
    let timeout = ctx.options.finalizer_timeout;
    if waited >= timeout {
        let message = format!(
            "Finalizer removed after {}s, provider resource may be orphaned: {}",
            timeout.as_secs(),
            remaining.join(", ")
        );
        ctx.event(md, EventType::Warning, "FinalizerTimeout", &message)
            .await;
        release_finalizer(md, ctx).await?;
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(
        DELETE_POLL.min(timeout.saturating_sub(waited)),
    ))
}

/// Remove this provider's finalizer from `md`.
pub(crate) async fn release_finalizer<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Result<(), Error> {
    let ours = ctx.finalizer();
    let rest = finalizers::without(md, |f| f == ours);
    finalizers::replace(&api_of(md, ctx), md, &rest).await?;
    Ok(())
}

/// Every object of `md` this provider may own: by kind, the names it renders now and the
/// names the caches hold labelled for `md`.
fn owned_candidates<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Vec<(ApiResource, String)> {
    let (ns, name) = (md.namespace().unwrap_or_default(), md.name_any());
    let upstream = ctx.upstream.borrow().clone();
    let mut targets: Vec<(ApiResource, String)> = Vec::new();
    if let Some(Ok(api)) = &upstream
        && let Ok(rendered) = ctx.provider.render(md, api)
    {
        targets.extend(
            rendered
                .objects
                .iter()
                .map(|o| (api.resource_of(o), o.name_any())),
        );
    }
    let mut kinds = owned_kinds(ctx, upstream.as_ref());
    kinds.extend(targets.iter().map(|(r, _)| r.clone()));
    kinds.extend(ctx.owned.kinds());
    for kind in kinds {
        for object in ctx.owned.names_for(&kind, &ns, &name) {
            targets.push((kind.clone(), object));
        }
    }
    targets.sort_by(|a, b| {
        (&a.0.api_version, &a.0.kind, &a.1).cmp(&(&b.0.api_version, &b.0.kind, &b.1))
    });
    targets.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    targets
}

/// Ask for the deletion of every object this provider made for `md` (never one another
/// owner made under the same name); return those that still exist (`Kind/name`).
pub(crate) async fn delete_owned<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Result<Vec<String>, Error> {
    let ns = md.namespace().unwrap_or_default();
    let mut remaining = Vec::new();
    for (resource, name) in owned_candidates(md, ctx) {
        ctx.owned.synced(&resource).await?;
        let Some(live) = ctx.owned.get(&resource, &ns, &name) else {
            continue;
        };
        if !owned_by(live.as_ref(), md) {
            continue;
        }
        if live.metadata.deletion_timestamp.is_none() {
            let objects: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), &ns, &resource);
            if !delete_as_read(&objects, &live).await? {
                ctx.owned.forget(&resource, &ns, &name);
                continue;
            }
        }
        remaining.push(format!("{}/{name}", resource.kind));
    }
    Ok(remaining)
}

/// Delete the objects `md` owns that are not among those rendered now.
pub(crate) async fn prune<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    objects: &[DynamicObject],
    resources: &[ApiResource],
) -> Result<(), Error> {
    let wanted: BTreeSet<(String, String, String)> = objects
        .iter()
        .zip(resources)
        .map(|(o, r)| (r.api_version.clone(), r.kind.clone(), o.name_any()))
        .collect();
    let ns = md.namespace().unwrap_or_default();
    for (resource, name) in owned_candidates(md, ctx) {
        if wanted.contains(&(
            resource.api_version.clone(),
            resource.kind.clone(),
            name.clone(),
        )) {
            continue;
        }
        let Some(live) = ctx.owned.get(&resource, &ns, &name) else {
            continue;
        };
        if !owned_by(live.as_ref(), md) || live.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let objects: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &resource);
        if delete_as_read(&objects, &live).await? {
            let message = format!(
                "Deleted {} '{name}': the ModelDeployment no longer needs it",
                resource.kind
            );
            ctx.event(md, EventType::Normal, "Pruned", &message).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::runtime::context::finalizer;
    use crate::runtime::fixtures::md_with;
    use crate::runtime::testing::{context, failure, respond};

    /// Deletion writes the `Terminating` status, then releases the finalizer with a patch
    /// guarded by the resourceVersion: the one the status write returned, as the API
    /// server answers a stale one with a conflict.
    #[tokio::test]
    async fn deletion_releases_the_finalizer_with_the_version_its_status_write_returned() {
        let (ctx, mut server) = context(Vec::new());
        let md = md_with(&json!({"metadata": {
            "finalizers": [finalizer("nothing"), "other.example/keep"],
            "deletionTimestamp": "2026-01-01T00:00:00Z",
        }}));
        let written = {
            let mut written = md.clone();
            written.metadata.resource_version = Some("2".into());
            written
        };
        let deleting = {
            let (md, ctx) = (md.clone(), ctx.clone());
            tokio::spawn(async move { cleanup(&md, &ctx).await.map_err(|e| e.to_string()) })
        };
        respond(&mut server, |method, path, body| {
            assert_eq!(
                (method, path),
                (
                    "PATCH",
                    "/apis/kubeairunway.ai/v1alpha1/namespaces/ns/modeldeployments/m/status"
                )
            );
            assert_eq!(body["status"]["phase"], "Terminating");
            (200, serde_json::to_value(&written).unwrap())
        })
        .await;
        respond(&mut server, |method, path, body| {
            assert_eq!(
                (method, path),
                (
                    "PATCH",
                    "/apis/kubeairunway.ai/v1alpha1/namespaces/ns/modeldeployments/m"
                )
            );
            assert_eq!(
                body["metadata"]["finalizers"],
                json!(["other.example/keep"])
            );
            if body["metadata"]["resourceVersion"] == "2" {
                (200, serde_json::to_value(&written).unwrap())
            } else {
                (409, failure(409, "Conflict"))
            }
        })
        .await;
        assert_eq!(deleting.await.unwrap(), Ok(Action::await_change()));
    }
}
