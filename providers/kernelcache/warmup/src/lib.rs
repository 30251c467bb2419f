//! The warmup controller: warms nodes before a model runs there, as RBG's warmup does
//! (upstream facts: docs/upstream.md#rbg-warmup), adapted to ModelDeployments and kernel
//! caches.
//!
//! A `Warmup` (the SDK's `api::warmup`, the contract it shares with the provider
//! runtime's warmup gate) targets nodes or the nodes a ModelDeployment can run on
//! ([`targets`]); on each it preloads images, waits for kernel caches to be staged by the
//! node agents ([`caches`]) and runs a custom pod, through one pod per node and attempt
//! ([`pod`]). What to do each time is decided by pure functions ([`resolve`],
//! [`decide`]); [`reconcile`] is the I/O around them, reading only from watch caches.
//!
//! Runs as its own binary, `kernelcache-warmup` ([`app`]): it creates and deletes pods in
//! every namespace, a privilege the cache controller (which reads registry Secrets) has no
//! need of, and the other way round.

pub mod app;
pub mod caches;
pub mod decide;
pub mod metrics;
pub mod pod;
pub mod policy;
pub mod reconcile;
pub mod resolve;
pub mod targets;

pub use reconcile::{FIELD_MANAGER, Settings, run};
