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
//! - what the providers know about engines, in one home each, for the built-in providers
//!   and third parties alike: each engine's flags, tensor parallelism, the Hugging Face
//!   token Secret and the whole serving container ([`engine`]), the GPUs of a replica
//!   ([`gpu`]), the storage volumes ([`storage`]) and a Deployment's status read as ours
//!   ([`workload`]);
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

pub mod access;
pub mod admission;
pub mod api;
pub mod compact;
pub mod conditions;
pub mod defaults;
pub mod engine;
pub mod engine_choice;
pub mod events;
pub mod finalizers;
pub mod gpu;
pub mod labels;
pub mod leader;
pub mod overrides;
pub mod process;
pub mod provider;
pub mod reconciles;
pub mod reflect;
pub mod render;
pub mod runtime;
pub mod selection;
pub mod serving;
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
pub use serving::ServingPods;
pub use upstream::UpstreamApi;

/// The Kubernetes API types `kube` is built with (feature `v1_37`), for the same reason:
/// a second version of them would not be the types `kube` takes.
pub use k8s_openapi;
/// The Kubernetes client library the SDK is built on, at the version it uses: a provider
/// names `kube::Client` and the like through it, without a version of its own to keep in
/// step.
pub use kube;

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

#[cfg(test)]
mod readme_tests {
    /// The README's "Testing your provider" section.
    fn testing_section() -> &'static str {
        let readme = include_str!("../README.md");
        let start = readme
            .find("## Testing your provider")
            .expect("the README's testing section");
        let rest = &readme[start + 2..];
        &rest[..rest.find("\n## ").unwrap_or(rest.len())]
    }

    /// The names of the `pub fn`s declared at the top level of a module's source.
    fn public_functions(source: &str) -> Vec<&str> {
        source
            .lines()
            .filter_map(|l| {
                l.strip_prefix("pub fn ")
                    .or_else(|| l.strip_prefix("pub async fn "))
            })
            .filter_map(|l| l.split(['(', '<']).next())
            .collect()
    }

    /// Every helper of the `testing` feature is documented where a provider's author
    /// looks for it, as `testing::<name>`.
    #[test]
    fn every_testing_helper_is_in_the_readme() {
        let section = testing_section();
        let mut helpers: Vec<String> = public_functions(include_str!("testing.rs"))
            .into_iter()
            .map(|f| format!("testing::{f}"))
            .collect();
        helpers.extend(
            public_functions(include_str!("testing/overrides.rs"))
                .into_iter()
                .map(|f| format!("testing::overrides::{f}")),
        );
        helpers.push("testing::mock::pair".into());
        assert!(helpers.len() > 10, "the helpers were found: {helpers:?}");
        let missing: Vec<&String> = helpers
            .iter()
            .filter(|h| !section.contains(h.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "not in the README's testing section: {missing:?}"
        );
    }

    /// The SDK's docs (README, rustdoc, comments, examples) stand on their own: no
    /// references to numbered sections (the section sign, U+00A7) of documents a third
    /// party does not have.
    #[test]
    fn docs_cite_no_sections_a_third_party_cannot_read() {
        fn visit(dir: &std::path::Path, found: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    visit(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs" || e == "md")
                    && std::fs::read_to_string(&path).unwrap().contains('\u{a7}')
                {
                    found.push(path.display().to_string());
                }
            }
        }
        let sdk = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut found = Vec::new();
        for part in ["README.md", "src", "examples", "tests"] {
            let path = sdk.join(part);
            if path.is_dir() {
                visit(&path, &mut found);
            } else if std::fs::read_to_string(&path).unwrap().contains('\u{a7}') {
                found.push(path.display().to_string());
            }
        }
        assert!(found.is_empty(), "section references in {found:?}");
    }

    #[test]
    fn public_functions_are_read_from_the_top_level_only() {
        let source = "pub fn a(x: u8) {}\npub async fn b<T>() {}\n    pub fn c() {}\nfn d() {}\n";
        assert_eq!(public_functions(source), ["a", "b"]);
    }
}
