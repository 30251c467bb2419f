//! The warmup gate at work in a reconcile ([`pass`]): the gate decided ([`super::gate`])
//! from the Warmup cache ([`super::warmups`]), the Warmup of an inline `spec.warmup`
//! created or deleted as it asks, and a held creation reported; on deletion, the Warmup
//! made for the ModelDeployment deleted ([`release`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::context::{Context, owned_kinds};
use super::delete::delete_if;
use super::error::{Error, is_refusal};
use super::gate::{Gate, Write, warmup_object};
use super::status;
use super::view::{ProviderView, compatibility};
use crate::api::{ModelDeployment, Phase, Warmup};
use crate::conditions::{PROVIDER_COMPATIBLE, READY, RESOURCE_CREATED, WARMED_UP};
use crate::events::EventType;
use crate::provider::{Provider, Warning};
use crate::render;
use crate::upstream::UpstreamApi;

/// What the warmup gate lets a reconcile do.
#[derive(Debug)]
pub(crate) enum Pass {
    /// Apply the rendered objects: no `spec.warmup`, or the gate is open (reported in
    /// the status).
    Apply(Option<Gate>),
    /// A scale-up or an upgrade waits for its warmup: every live object stays as it is,
    /// and the status reports them with the gate.
    KeepLive(Gate),
    /// A creation waits: its status is written; look again after this.
    Held(Action),
}

/// The warmup gate of one reconcile of `md`, which renders `objects` (finished, the
/// primary first) for `api` with `warnings`: decided from the caches, the Warmup of an
/// inline `spec.warmup` written as the gate asks, a held creation reported.
pub(crate) async fn pass<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    api: &UpstreamApi,
    warnings: &[Warning],
    objects: &[DynamicObject],
) -> Result<Pass, Error> {
    let owned = if md.spec.warmup.is_some() {
        owned_live(md, ctx)
    } else {
        Vec::new()
    };
    let gate = ctx.warmups.gate(md, ctx.name(), objects, &owned);
    sync(md, ctx, gate.as_ref(), objects).await?;
    if let Some(action) = hold(md, ctx, api, warnings, objects, gate.as_ref()).await? {
        return Ok(Pass::Held(action));
    }
    Ok(match gate {
        Some(gate) if !gate.open => Pass::KeepLive(gate),
        gate => Pass::Apply(gate),
    })
}

/// Every object `md` owns that the caches hold, of every kind the provider renders or
/// owns (being deleted or not): what runs for it, for the warmup gate.
fn owned_live<P: Provider>(md: &ModelDeployment, ctx: &Context<P>) -> Vec<Arc<DynamicObject>> {
    let (ns, name) = (md.namespace().unwrap_or_default(), md.name_any());
    let upstream = ctx.upstream.borrow().clone();
    let mut kinds = owned_kinds(ctx, upstream.as_ref());
    kinds.extend(ctx.owned.kinds());
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for kind in kinds {
        if !seen.insert((kind.api_version.clone(), kind.kind.clone())) {
            continue;
        }
        for object in ctx.owned.names_for(&kind, &ns, &name) {
            if let Some(live) = ctx.owned.get(&kind, &ns, &object)
                && render::owned_by(live.as_ref(), md)
            {
                out.push(live);
            }
        }
    }
    out
}

/// The hook before anything is applied: while the creation of `md` is held (`gate`),
/// write a status that says why (phase `Pending`, or `Failed` for a failed Warmup;
/// `ResourceCreated`, `Ready` and `WarmedUp` false; the rendered images) and apply
/// nothing. `Some(action)` when held.
async fn hold<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    api: &UpstreamApi,
    warnings: &[Warning],
    objects: &[DynamicObject],
    gate: Option<&Gate>,
) -> Result<Option<Action>, Error> {
    let Some(gate) = gate.filter(|g| !g.open && g.create) else {
        return Ok(None);
    };
    let (reason, message) = compatibility(ctx.name(), api, warnings);
    let phase = if gate.failed {
        Phase::Failed
    } else {
        Phase::Pending
    };
    let mut view = ProviderView::new(phase, gate.message.clone())
        .condition(PROVIDER_COMPATIBLE, true, reason, message)
        .condition(RESOURCE_CREATED, false, gate.reason, gate.message.clone())
        .condition(READY, false, gate.reason, gate.message.clone())
        .condition(WARMED_UP, false, gate.reason, gate.message.clone());
    view.images = Some(render::images(objects));
    status::apply(ctx, md, &view).await?;
    Ok(Some(Action::requeue(ctx.options.resync_period)))
}

/// The writes the gate asked for, before anything else is applied: for an inline
/// `spec.warmup`, create its Warmup ([`Write::Create`], server-side apply) or delete it
/// to make it again ([`Write::Delete`]); without one (none, or a named Warmup), delete
/// the Warmup the runtime made for an inline one before, unless it is the one named. A Warmup the API server refuses
/// is told in a warning event (the gate keeps holding, and says it is creating it).
async fn sync<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    gate: Option<&Gate>,
    rendered: &[DynamicObject],
) -> Result<(), Error> {
    let inline = md.spec.warmup.as_ref().filter(|w| w.is_inline());
    let api: Api<Warmup> = Api::namespaced(ctx.client.clone(), &md.namespace().unwrap_or_default());
    match (inline, gate.map(|g| g.write)) {
        (Some(warmup), Some(Write::Create)) => {
            let (object, _) = warmup_object(md, warmup, ctx.name(), &render::images(rendered));
            let pp = PatchParams::apply(&ctx.field_manager()).force();
            match api
                .patch(&object.name_any(), &pp, &Patch::Apply(&object))
                .await
            {
                Ok(_) => {
                    let message = format!(
                        "Created Warmup '{}' from the inline spec.warmup",
                        object.name_any()
                    );
                    ctx.event(md, EventType::Normal, "WarmupCreated", &message)
                        .await;
                }
                Err(kube::Error::Api(s)) if is_refusal(s.code) => {
                    let message = format!(
                        "the API server refused Warmup '{}' made from the inline spec.warmup: {}",
                        object.name_any(),
                        s.message
                    );
                    ctx.event(md, EventType::Warning, "WarmupRefused", &message)
                        .await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        (Some(_), Some(Write::Delete)) => {
            if let Some(made) = ctx.warmups.made_for(md)
                && delete_made(&api, &made).await?
            {
                let message = format!(
                    "Deleted Warmup '{}' to make it again: {}",
                    made.name_any(),
                    gate.map(|g| g.message.as_str()).unwrap_or_default()
                );
                ctx.event(md, EventType::Normal, "WarmupRecreating", &message)
                    .await;
            }
        }
        (Some(_), _) => {}
        (None, _) => {
            // Named now: the Warmup made before is kept when it is the one named.
            let named = md.spec.warmup.as_ref().and_then(|w| w.name.clone());
            if let Some(made) = ctx.warmups.made_for(md)
                && named != Some(made.name_any())
                && made.metadata.deletion_timestamp.is_none()
                && delete_made(&api, &made).await?
            {
                let message = format!(
                    "Deleted Warmup '{}': spec.warmup is no longer inline",
                    made.name_any()
                );
                ctx.event(md, EventType::Normal, "Pruned", &message).await;
            }
        }
    }
    Ok(())
}

/// Delete the Warmup the runtime made, `made` as the cache holds it: only that object
/// (its uid), whatever its status became since. `Ok(false)` when it is gone already.
async fn delete_made(api: &Api<Warmup>, made: &Warmup) -> Result<bool, kube::Error> {
    delete_if(api, made, None).await
}

/// On deletion: delete the Warmup the runtime made for `md` (the garbage collector would
/// too, through its owner reference, once `md` is gone); `Some("Warmup/<name>")` while it
/// still exists.
pub(crate) async fn release<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Result<Option<String>, Error> {
    let Some(made) = ctx.warmups.made_for(md) else {
        return Ok(None);
    };
    if made.metadata.deletion_timestamp.is_none() {
        let api: Api<Warmup> =
            Api::namespaced(ctx.client.clone(), &md.namespace().unwrap_or_default());
        if !delete_made(&api, &made).await? {
            return Ok(None);
        }
    }
    Ok(Some(format!("{}/{}", Warmup::kind(&()), made.name_any())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DeploymentWarmup;
    use crate::labels;
    use crate::runtime::fixtures::{gated_md, object};
    use crate::runtime::testing::{context, echo, requests_of};
    const WARMUPS: &str = "/apis/cache.kubeairunway.ai/v1alpha1/namespaces/ml/warmups/m";
    /// An inline spec.warmup with nothing created yet: the Warmup is applied (and an
    /// event says so); once it is there, nothing more is written.
    #[tokio::test]
    async fn the_inline_warmup_is_applied_once_and_then_left_alone() {
        let mut inline = gated_md(false, None);
        inline.metadata.uid = Some("u".into());
        inline.spec.warmup = Some(DeploymentWarmup::default());
        let rendered = vec![object("Server", "m", Some("replicas=1"), "llama.cpp:b1")];
        let (ctx, mut server) = context(Vec::new());
        let gate = ctx.warmups.gate(&inline, ctx.name(), &rendered, &[]);
        assert_eq!(gate.as_ref().unwrap().write, Write::Create);
        let step = {
            let (ctx, md, rendered) = (ctx.clone(), inline.clone(), rendered.clone());
            tokio::spawn(async move {
                sync(&md, &ctx, gate.as_ref(), &rendered).await.unwrap();
            })
        };
        let sent = requests_of(&mut server, step, echo).await;
        assert_eq!(sent[0].0, format!("PATCH {WARMUPS}"));
        assert_eq!(sent[0].1["spec"]["targetModelDeployment"]["name"], "m");
        assert_eq!(
            sent[0].1["metadata"]["annotations"][labels::IMAGES],
            "llama.cpp:b1"
        );
        assert_eq!(sent[0].1["metadata"]["ownerReferences"][0]["uid"], "u");
        assert_eq!(sent.len(), 2, "the Warmup and an event: {sent:?}");

        // The cache shows it: nothing to write.
        let (made, _) = warmup_object(
            &inline,
            &DeploymentWarmup::default(),
            "nothing",
            &render::images(&rendered),
        );
        let (ctx, mut server) = context(vec![made]);
        let gate = ctx.warmups.gate(&inline, ctx.name(), &rendered, &[]);
        assert_eq!(gate.as_ref().unwrap().write, Write::Nothing);
        let step = {
            let (ctx, md) = (ctx.clone(), inline.clone());
            tokio::spawn(async move {
                sync(&md, &ctx, gate.as_ref(), &rendered).await.unwrap();
            })
        };
        assert!(requests_of(&mut server, step, echo).await.is_empty());
    }
    /// spec.warmup no longer inline (removed, or naming a Warmup): the Warmup made for it
    /// is deleted, that one only (its uid).
    #[tokio::test]
    async fn the_warmup_made_for_an_inline_spec_goes_when_spec_warmup_changes_form() {
        let mut inline = gated_md(false, None);
        inline.metadata.uid = Some("u".into());
        inline.spec.warmup = Some(DeploymentWarmup::default());
        let (mut made, _) = warmup_object(&inline, &DeploymentWarmup::default(), "nothing", &[]);
        made.metadata.uid = Some("w-1".into());
        for warmup in [None, Some(DeploymentWarmup::named("other"))] {
            // The status still says WarmedUp (spec.warmup was there).
            let mut now = gated_md(false, Some("True"));
            now.metadata.uid = Some("u".into());
            now.spec.warmup = warmup;
            let (ctx, mut server) = context(vec![made.clone()]);
            let step = {
                let (ctx, md) = (ctx.clone(), now.clone());
                tokio::spawn(async move {
                    let gate = ctx.warmups.gate(&md, ctx.name(), &[], &[]);
                    sync(&md, &ctx, gate.as_ref(), &[]).await.unwrap();
                })
            };
            let sent = requests_of(&mut server, step, echo).await;
            assert_eq!(sent[0].0, format!("DELETE {WARMUPS}"), "{sent:?}");
            assert_eq!(sent[0].1["preconditions"]["uid"], "w-1");
        }
        // Named itself now: kept, and gated on.
        let mut named = gated_md(false, Some("True"));
        named.metadata.uid = Some("u".into());
        named.spec.warmup = Some(DeploymentWarmup::named("m"));
        let (ctx, mut server) = context(vec![made.clone()]);
        let step = tokio::spawn(async move {
            let gate = ctx.warmups.gate(&named, ctx.name(), &[], &[]);
            sync(&named, &ctx, gate.as_ref(), &[]).await.unwrap();
        });
        assert!(requests_of(&mut server, step, echo).await.is_empty());
        // Someone else's Warmup of that name is never deleted.
        let mut theirs = made.clone();
        theirs.metadata.owner_references = None;
        let (ctx, mut server) = context(vec![theirs]);
        let now = {
            let mut m = gated_md(false, Some("True"));
            m.metadata.uid = Some("u".into());
            m
        };
        let step = tokio::spawn(async move {
            sync(&now, &ctx, None, &[]).await.unwrap();
        });
        assert!(requests_of(&mut server, step, echo).await.is_empty());
    }
}
