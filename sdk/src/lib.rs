//! # kubeairunway-sdk
//!
//! The API types of `kubeairunway.ai/v1alpha1` ([`ModelDeployment`],
//! [`InferenceProviderConfig`]) and the helpers every controller of the platform shares:
//! condition handling ([`conditions`]) and the well-known labels and annotations
//! ([`labels`]).
//!
//! The types do no I/O. They serialise to exactly what the API server stores, with
//! optional fields left out when unset, so that a controller applying a partial status by
//! server-side apply owns only the fields it sets.
#![deny(missing_docs)]

pub mod api;
pub mod conditions;
pub mod labels;

pub use api::model_deployment::{ModelDeployment, ModelDeploymentSpec, ModelDeploymentStatus};
pub use api::provider_config::{
    InferenceProviderConfig, InferenceProviderConfigSpec, InferenceProviderConfigStatus,
};

/// The API group of every kubeairunway kind.
pub const GROUP: &str = "kubeairunway.ai";
/// The served (and storage) version of the kubeairunway kinds.
pub const VERSION: &str = "v1alpha1";
/// `group/version`, as it appears in `apiVersion`.
pub const API_VERSION: &str = "kubeairunway.ai/v1alpha1";
