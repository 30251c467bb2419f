//! Kernel-cache images as artifacts: what the controller, the node agent and the CLI
//! share, and nothing that verifies signatures (the privileged agent links none of that).
//!
//! - [`registry`]: a bounded registry client (every body capped, every request under a
//!   deadline) and [`oci`], pulls by digest on top of it, streaming each layer through
//!   its digest check into safe extraction ([`extract`], [`files`]);
//! - [`image`]: a cache image's labels and manifest (the GKM/MCV "compat" format), and
//!   [`compat`], whether a cache fits a GPU; [`triton`] rewrites Triton group files to
//!   the path pods see;
//! - [`modelpack`]: OCI model artifacts (ModelPack, KitOps ModelKit) pulled by digest
//!   into the Hugging Face cache layout (`oci://` ModelCache sources);
//! - [`allow`]: the registries the operator allows images from;
//! - [`credentials`]: registry credentials from Docker config Secrets, read from
//!   Kubernetes by [`secrets`].

pub mod allow;
pub mod compat;
pub mod credentials;
pub mod extract;
pub mod files;
pub mod image;
pub mod modelpack;
pub mod oci;
pub mod registry;
pub mod sealed;
pub mod secrets;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod triton;
