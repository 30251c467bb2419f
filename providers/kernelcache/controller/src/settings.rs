//! What the kernel-cache controller is told, and what its controllers share.

use std::time::Duration;

use kubeairunway_kernelcache_artifact::allow::AllowedRegistries;

/// Field manager of the KernelCache status.
pub const FIELD_MANAGER: &str = "kernelcache-controller";

/// What the controller is told.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Name of the cluster-scoped `KernelCachePolicy` to verify with.
    pub policy: String,
    /// Registries spoken to over plain HTTP.
    pub plain_http: Vec<String>,
    /// The registries caches may come from (empty: any).
    pub allowed: AllowedRegistries,
    /// How often a cache is looked at again without a change (tag moves, heartbeat).
    pub resync: Duration,
    /// This replica's name, for events.
    pub instance: Option<String>,
    /// Where registry credentials are handed over to the node agents
    /// ([`handover`]); none: caches with imagePullSecrets are pinned and verified, but no
    /// agent can pull them.
    pub credentials_namespace: Option<String>,
    /// The node agents' model-cache root (`HF_HOME` on every node, the same path on
    /// each): the local PersistentVolumes of ready ModelCaches point below it. None: no
    /// volumes are made.
    pub model_cache_root: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            policy: "default".into(),
            plain_http: Vec::new(),
            allowed: AllowedRegistries::default(),
            resync: Duration::from_secs(300),
            instance: None,
            credentials_namespace: None,
            model_cache_root: None,
        }
    }
}

/// How long a reconcile waits for the watch caches it reads to be filled once before it
/// tries again later: it never decides on a partial view.
pub(crate) const SYNC_WAIT: Duration = Duration::from_secs(30);
