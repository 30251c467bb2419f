//! Warmup: warm nodes before a model runs there (seed 003, RBG's KEP-129, as RBG
//! implemented it in sgl-project/rbg v0.8.0-alpha.5, adapted to ModelDeployments and
//! kernel caches).
//!
//! A `Warmup` ([`api`]) targets nodes or the nodes a ModelDeployment can run on
//! ([`targets`]); on each it preloads images, waits for kernel caches to be staged by the
//! node agents ([`caches`]) and runs a custom pod, through one pod per node and attempt
//! ([`pod`]). What to do each time is decided by pure functions ([`resolve`],
//! [`decide`]); [`reconcile`] is the I/O around them, reading only from watch caches.
//!
//! Runs as its own binary, `kernelcache-warmup` ([`app`]): it creates and deletes pods in
//! every namespace, a privilege the cache controller (which reads registry Secrets) has no
//! need of, and the other way round.

pub mod api;
pub mod app;
pub mod caches;
pub mod decide;
pub mod pod;
pub mod reconcile;
pub mod resolve;
pub mod targets;

pub use reconcile::{Settings, run};

/// Field manager of the Warmup status.
pub const FIELD_MANAGER: &str = "kernelcache-warmup";

/// Condition types of a Warmup (those of a Job, as RBG writes them, plus `Progressing`).
pub mod condition_types {
    /// `True` while nodes are being warmed; `False` with why while it waits, or once it
    /// finished.
    pub const PROGRESSING: &str = "Progressing";
    /// `True` once it completed.
    pub const COMPLETE: &str = "Complete";
    /// `True` once it failed.
    pub const FAILED: &str = "Failed";
}

/// Condition reasons of the warmup controller (on Warmups, on `WarmedUp`) and reasons of
/// a node's failure.
pub mod reasons {
    /// `Progressing=True`.
    pub const WARMUP_IN_PROGRESS: &str = "WarmupInProgress";
    /// `Progressing=False`: the warmup is over.
    pub const FINISHED: &str = "Finished";
    /// Waiting: the target ModelDeployment does not exist (failed, if it went away while
    /// the warmup ran).
    pub const TARGET_NOT_FOUND: &str = "TargetNotFound";
    /// Waiting: the provider of a targetModelDeployment (without imagesPreload) has not
    /// reported the images it renders for the current generation.
    pub const IMAGES_NOT_REPORTED: &str = "ImagesNotReported";
    /// Waiting: a targetModelDeployment gives nothing to do (no imagesPreload,
    /// kernelCaches or customAction, and the ModelDeployment names no image or kernel
    /// cache).
    pub const NOTHING_TO_WARM: &str = "NothingToWarm";
    /// `Complete=True`: every node is done.
    pub const NODES_WARMED: &str = "NodesWarmed";
    /// `Complete=True`: no node matches the target.
    pub const NO_NODES_MATCHED: &str = "NoNodesMatched";
    /// `Failed=True`: more nodes failed than `maxFailedNodes`.
    pub const MAX_FAILED_NODES_EXCEEDED: &str = "MaxFailedNodesExceeded";
    /// `Failed=True`: `globalTimeoutSeconds` ran out.
    pub const GLOBAL_TIMEOUT_EXCEEDED: &str = "GlobalTimeoutExceeded";
    /// `Failed=True`: the spec cannot run (a pod template the API server refuses).
    pub const INVALID_SPEC: &str = "InvalidSpec";

    /// Node: a warmup pod failed (a container exited non-zero).
    pub const POD_FAILED: &str = "PodFailed";
    /// Node: no Node of that name.
    pub const NODE_NOT_FOUND: &str = "NodeNotFound";
    /// Node: the warmup pods do not tolerate one of its scheduling taints.
    pub const UNTOLERATED_TAINT: &str = "UntoleratedTaint";
    /// Node: a KernelCache of the warmup does not select the node.
    pub const KERNEL_CACHE_NOT_TARGETED: &str = "KernelCacheNotTargeted";
    /// Node: the agent failed to stage a KernelCache.
    pub const KERNEL_CACHE_FAILED: &str = "KernelCacheFailed";
    /// Node: a KernelCache fits none of its GPUs.
    pub const KERNEL_CACHE_INCOMPATIBLE: &str = "KernelCacheIncompatible";

    /// Events: a node is warm; an attempt failed and is retried; a node failed for good.
    pub const NODE_WARMED: &str = "NodeWarmed";
    /// See [`NODE_WARMED`].
    pub const NODE_RETRYING: &str = "NodeRetrying";
    /// See [`NODE_WARMED`].
    pub const NODE_FAILED: &str = "NodeFailed";
    /// Event: the warmup started.
    pub const STARTED: &str = "WarmupStarted";
    /// Event: the TTL ran out; the Warmup is deleted.
    pub const TTL_EXPIRED: &str = "TTLExpired";
}
