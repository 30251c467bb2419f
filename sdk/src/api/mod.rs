//! The `kubeairunway.ai/v1alpha1` kinds.
//!
//! [`model_deployment`] is field-for-field compatible with the ModelDeployment that AI
//! Runway shipped under the same group, so a manifest written for it is accepted here;
//! fields of ours are optional additions. [`provider_config`] is how providers register.
//! [`warmup`] is the `Warmup` kind (`cache.kubeairunway.ai`), shared by the provider
//! runtime's warmup gate and the warmup controller.

pub mod crds;
pub mod model_deployment;
pub mod provider_config;
pub mod schema;
pub mod warmup;

pub use model_deployment::*;
pub use provider_config::*;
pub use warmup::{
    CustomAction, DeploymentWarmup, ImagesPreload, NodeFailure, TargetModelDeployment, TargetNodes,
    Warmup, WarmupPhase, WarmupPolicies, WarmupSpec, WarmupStatus,
};
