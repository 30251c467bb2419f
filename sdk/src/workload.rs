//! Reading plain Kubernetes workloads as our status: for providers whose upstream is a
//! built-in kind rather than an operator's custom resource. Each reader judges a live
//! object the way `kubectl rollout status` does (docs/upstream.md#kubernetes-rollout-status),
//! with the conditions its controller writes, and reads nothing but the object:
//!
//! - [`deployment`]: an `apps/v1` Deployment (`Failed` once it exceeded its progress
//!   deadline, the one failure its controller declares lasting);
//! - [`statefulset`]: an `apps/v1` StatefulSet (ready replicas, then the rolling update:
//!   its partition, then the current revision reaching the update revision);
//! - [`daemonset`]: an `apps/v1` DaemonSet (updated, then available pods on every node it
//!   schedules to);
//! - [`job`]: a `batch/v1` Job (`Failed` on its `Failed` condition; `Running` while its
//!   pods are ready, and once it completed).

mod daemonset;
mod deployment;
mod job;
mod read;
mod statefulset;

pub use daemonset::daemonset;
pub use deployment::{PROGRESS_DEADLINE_EXCEEDED, deployment};
pub use job::job;
pub use statefulset::statefulset;
