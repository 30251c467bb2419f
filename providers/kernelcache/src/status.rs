//! Writing an object's status by forced server-side apply: the one request every
//! kernel-cache component (controller, agent, warmup) makes to report what it saw.

use std::fmt::Debug;

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

/// Apply `status` as the status of `name` under the field manager `manager` (forced),
/// returning the object as written.
pub async fn apply<K>(
    api: &Api<K>,
    name: &str,
    manager: &str,
    status: &impl Serialize,
) -> kube::Result<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": name},
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&body),
    )
    .await
}
