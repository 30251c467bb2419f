//! # kubeairunway-core
//!
//! The core controller of kubeairunway: admission webhooks for ModelDeployment
//! ([`webhook`]) with self-managed TLS (`kubeairunway_sdk::tls`), provider selection
//! ([`selection`], the SDK's pure functions), the ModelDeployment reconciler ([`reconciler`]), leader election
//! (`kubeairunway_sdk::leader`) and observability ([`metrics`]). It contains no knowledge of any particular provider.

pub mod validation;

/// Spec defaults and provider selection are the SDK's (pure functions every component and
/// the CLI share); core applies them.
pub use kubeairunway_sdk::{defaults, selection};

/// The field manager core applies its status fields with.
pub const FIELD_MANAGER: &str = kubeairunway_sdk::CORE_FIELD_MANAGER;
pub mod access;
pub mod app;
pub mod context;
pub mod gateway;
mod gone;
pub mod metrics;
pub mod reconciler;
mod rules;
pub mod webhook;
