//! # kubeairunway-sdk
//!
//! Everything a kubeairunway provider is built on, ours and third parties' alike:
//!
//! - the API types of `kubeairunway.ai/v1alpha1` ([`ModelDeployment`],
//!   [`InferenceProviderConfig`]) in [`api`], with condition handling ([`conditions`]) and
//!   the well-known labels and annotations ([`labels`]);
//! - the [`Provider`] trait: the pure functions a provider writes ([`provider`]), with
//!   helpers for rendering ([`render`]), typed `provider.overrides` ([`overrides`]) and
//!   the installed upstream API ([`upstream`]);
//! - building blocks for providers that render pods themselves: the serving container of
//!   an engine ([`engine`]), its storage volumes ([`storage`]) and a Deployment's status
//!   read as ours ([`workload`]);
//! - provider selection as pure functions ([`selection`], over the spec with its
//!   [`defaults`] applied), as core runs it; the CRD's own validation rules evaluated
//!   offline ([`validation`]);
//! - the runtime that does all the I/O ([`runtime::run`]; a provider's `main` is
//!   [`runtime::main`]);
//! - for components that serve admission webhooks or run several replicas: self-managed
//!   webhook TLS ([`tls`]) and Lease leader election ([`leader`]);
//! - with the `testing` feature, helpers for provider authors' tests ([`testing`]).
//!
//! The provider contract (what a provider must and should do, and what the runtime does
//! for it) is in the crate's README.
#![deny(missing_docs)]

pub mod admission;
pub mod api;
pub mod compact;
pub mod conditions;
pub mod defaults;
pub mod engine;
pub mod events;
pub mod labels;
pub mod leader;
pub mod overrides;
pub mod process;
pub mod provider;
pub mod reflect;
pub mod render;
pub mod runtime;
pub mod selection;
pub mod storage;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;
pub mod upstream;
pub mod validation;
pub mod workload;

pub use provider::{
    Incompatible, Live, Observed, Provider, RenderError, Rendered, UpstreamRef, Warning,
};
pub use upstream::UpstreamApi;

/// The crate's README, whose Rust code is compiled as a doc test: as a crate of its own
/// would compile it, from the public API alone.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

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
/// The field manager core applies its status fields (the selection) with; providers and
/// tests that play core name it from here.
pub const CORE_FIELD_MANAGER: &str = "kubeairunway-controller";
