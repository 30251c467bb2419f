//! The kernel-cache provider: node-level GPU kernel caches (Triton and vLLM
//! torch.compile caches, packaged as OCI images in the GKM/MCV "compat" format), verified,
//! staged on the GPU nodes they fit, and mounted into any provider's serving pods.
//!
//! This crate holds the provider's API ([`api`]) and the pure parts every component
//! shares: reading a cache image's labels and manifest ([`image`]), deciding per GPU
//! whether a cache fits ([`compat`]), extracting a cache layer safely ([`extract`]),
//! rewriting Triton group files to the path pods see ([`triton`]), and the pod patch that
//! mounts a cache ([`inject`]). [`warmup`] warms nodes before a model runs there.

pub mod agent;
pub mod api;
pub mod build;
pub mod bundle;
pub mod compat;
pub mod controller;
pub mod credentials;
pub mod extract;
pub mod files;
pub mod image;
pub mod inject;
pub mod oci;
pub mod reconciles;
pub mod registry;
pub mod seed;
pub mod sign;
pub mod status;
pub mod triton;
pub mod verify;
pub mod vllm;
pub mod warmup;
pub mod webhook;
