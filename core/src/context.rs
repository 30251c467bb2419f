//! What core's reconciler is told ([`Settings`]), shares between reconciles ([`Context`])
//! and fails with ([`Error`]).

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use kubeairunway_sdk::events::{Recorder, Reporter};
use kubeairunway_sdk::{InferenceProviderConfig, ModelDeployment};

use crate::FIELD_MANAGER;
use crate::metrics::Metrics;
use crate::selection::{self, RuleCache};

/// Controller settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Run the built-in provider selection (`--enable-provider-selector`).
    pub enable_provider_selector: bool,
    /// Selection settings.
    pub selection: selection::Settings,
    /// Only this namespace (all when `None`).
    pub namespace: Option<String>,
    /// How often to look again at a ModelDeployment that waits for a provider.
    pub pending_requeue: Duration,
    /// How long a deleted ModelDeployment waits for a provider that is gone to remove its
    /// finalizer before core removes it.
    pub finalizer_timeout: Duration,
    /// Reporter name for events.
    pub reporter: Reporter,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            enable_provider_selector: true,
            selection: selection::Settings::default(),
            namespace: None,
            pending_requeue: Duration::from_secs(30),
            finalizer_timeout: Duration::from_secs(300),
            reporter: Reporter {
                controller: FIELD_MANAGER.into(),
                instance: None,
            },
        }
    }
}

/// Reconciliation errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Applying status failed.
    #[error("applying status: {0}")]
    Apply(#[source] kube::Error),
    /// Removing a finalizer failed.
    #[error("removing a finalizer: {0}")]
    Finalizer(#[source] kube::Error),
    /// The decision did not complete.
    #[error("deciding: {0}")]
    Decide(String),
    /// Serialising failed.
    #[error("serialising: {0}")]
    Serialize(#[from] serde_json::Error),
    /// The cached ModelDeployment did not read back.
    #[error("{0}")]
    Cache(#[from] kubeairunway_sdk::compact::Error),
}

impl Error {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Error::Apply(_) => "apply",
            Error::Finalizer(_) => "finalizer",
            Error::Decide(_) => "decide",
            Error::Serialize(_) => "serialize",
            Error::Cache(_) => "cache",
        }
    }
}

/// Shared state of the reconciler.
pub struct Context {
    pub(crate) client: Client,
    pub(crate) providers: Store<InferenceProviderConfig>,
    pub(crate) rules: RuleCache,
    pub(crate) settings: Settings,
    pub(crate) recorder: Recorder,
    pub(crate) metrics: Arc<Metrics>,
    /// Consecutive failures, for backoff.
    pub(crate) failures:
        std::sync::Mutex<std::collections::HashMap<ObjectRef<ModelDeployment>, u32>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context over a provider cache.
    pub fn new(
        client: Client,
        providers: Store<InferenceProviderConfig>,
        settings: Settings,
        metrics: Arc<Metrics>,
    ) -> Self {
        let recorder = Recorder::new(client.clone(), settings.reporter.clone());
        Self {
            client,
            providers,
            rules: RuleCache::default(),
            settings,
            recorder,
            metrics,
            failures: std::sync::Mutex::default(),
        }
    }
}
