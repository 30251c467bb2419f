//! # kubeairunway-core
//!
//! The core controller of kubeairunway: admission webhooks for ModelDeployment
//! ([`webhook`]) with self-managed TLS (`kubeairunway_sdk::tls`), provider selection
//! ([`selection`]), the ModelDeployment reconciler ([`reconciler`]), leader election
//! (`kubeairunway_sdk::leader`) and observability ([`metrics`]). It contains no knowledge of any particular provider.

pub mod defaults;
pub mod selection;
pub mod validation;

/// The field manager core applies its status fields with.
pub const FIELD_MANAGER: &str = "kubeairunway-controller";
pub mod app;
pub mod metrics;
pub mod reconciler;
pub mod webhook;
