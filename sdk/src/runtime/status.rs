//! Writing the provider's part of a ModelDeployment's status by server-side apply.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::context::Context;
use super::gate::keep_open;
use super::view::ProviderView;
use crate::api::ModelDeployment;
use crate::provider::Provider;

/// Apply `view` to `md`'s status under the provider's field manager, unless it is
/// already current. Forced: after selection the provider owns the phase, even if core
/// had not yet released it. Returns the ModelDeployment as written (`None` when nothing
/// was written).
pub(crate) async fn apply<P: Provider>(
    ctx: &Context<P>,
    md: &ModelDeployment,
    view: &ProviderView,
) -> Result<Option<ModelDeployment>, kube::Error> {
    let pods = ctx.provider.serving_pods(md);
    let view = &keep_open(view.clone(), md).addressed(md, &ctx.options.cluster_domain, &pods);
    if view.is_current(md) {
        return Ok(None);
    }
    let api: Api<ModelDeployment> =
        Api::namespaced(ctx.client.clone(), &md.namespace().unwrap_or_default());
    let patch = json!({
        "apiVersion": crate::API_VERSION,
        "kind": "ModelDeployment",
        "status": view.to_status(md, Timestamp::now()),
    });
    api.patch_status(
        &md.name_any(),
        &PatchParams::apply(&ctx.field_manager()).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(Some)
}
