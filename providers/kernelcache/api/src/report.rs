//! How every kernel-cache component (controller, agent, warmup) reports what it saw:
//! its status, written by forced server-side apply, and API errors told as text.

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

/// A kube error with the status the API server answered, when there is one.
pub fn kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        other => {
            let text = other.to_string();
            if text.trim().is_empty() {
                format!("{other:?}")
            } else {
                text
            }
        }
    }
}

/// Why a reconcile of a kernel-cache controller failed (it is retried): the one error type
/// of the kernel-cache controller and the warmup controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A cached ModelDeployment did not read back.
    #[error("{0}")]
    Cache(#[from] kubeairunway_sdk::compact::Error),
}
