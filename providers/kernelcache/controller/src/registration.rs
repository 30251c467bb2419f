//! The `kernelcache` InferenceProviderConfig: a capability, never selected to serve (it
//! lists no engines).

use std::time::Duration;

use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::warn;

use kubeairunway_kernelcache_api::names::{PROVIDER_FIELD_MANAGER, PROVIDER_NAME};

/// Register the `kernelcache` InferenceProviderConfig (a capability, never selected to
/// serve: no engines) and keep its heartbeat fresh: its spec is applied once (again only
/// if the object is gone), its status every heartbeat.
pub(crate) async fn register(client: Client, every: Duration) {
    use kubeairunway_sdk::InferenceProviderConfig;
    let api: Api<InferenceProviderConfig> = Api::all(client);
    let pp = PatchParams::apply(PROVIDER_FIELD_MANAGER).force();
    let spec = json!({
        "apiVersion": "kubeairunway.ai/v1alpha1",
        "kind": "InferenceProviderConfig",
        "metadata": {"name": PROVIDER_NAME},
        "spec": {
            "capabilities": {"features": ["kernelCache"]},
            "documentation": "Verified GPU kernel caches staged on nodes and mounted into serving pods (KernelCache, cache.kubeairunway.ai).",
        },
    });
    let mut registered = false;
    loop {
        if !registered {
            match api.patch(PROVIDER_NAME, &pp, &Patch::Apply(&spec)).await {
                Ok(_) => registered = true,
                Err(e) => warn!(error = %e, "registering the kernelcache InferenceProviderConfig"),
            }
        }
        if registered {
            let status = json!({
                "apiVersion": "kubeairunway.ai/v1alpha1",
                "kind": "InferenceProviderConfig",
                "metadata": {"name": PROVIDER_NAME},
                "status": {
                    "ready": true,
                    "version": env!("CARGO_PKG_VERSION"),
                    "lastHeartbeat": k8s_openapi::jiff::Timestamp::now().to_string(),
                },
            });
            match api
                .patch_status(PROVIDER_NAME, &pp, &Patch::Apply(&status))
                .await
            {
                Ok(_) => {}
                // Deleted since: registered again at once.
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    registered = false;
                    continue;
                }
                Err(e) => warn!(error = %e, "heartbeat of the kernelcache InferenceProviderConfig"),
            }
        }
        tokio::time::sleep(every.min(Duration::from_secs(30))).await;
    }
}
