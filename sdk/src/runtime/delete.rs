//! Deletions guarded by preconditions: an object is deleted only as it was read, so a
//! stale decision never deletes what another writer has since taken over.

use std::fmt::Debug;
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// How long to wait between looks while something is being deleted (the delete events
/// wake the reconciler sooner).
pub(crate) const DELETE_POLL: Duration = Duration::from_secs(2);

/// Delete `live` as it was read: only if it is still that version (its resourceVersion
/// and uid), so that an object another writer took over meanwhile (the provider now
/// serving the ModelDeployment) is never deleted by a stale decision. `Ok(false)` when it
/// is gone or changed.
pub(crate) async fn delete_as_read(
    api: &Api<DynamicObject>,
    live: &DynamicObject,
) -> Result<bool, kube::Error> {
    delete_if(api, live, live.resource_version()).await
}

/// Delete `object` only if the API server still holds that object (its uid) and, when
/// `resource_version` is given, at that version. `Ok(false)` when it is gone or the
/// precondition failed.
pub(crate) async fn delete_if<K>(
    api: &Api<K>,
    object: &K,
    resource_version: Option<String>,
) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version,
            uid: object.uid(),
        }),
        ..DeleteParams::background()
    };
    match api.delete(&object.name_any(), &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}
