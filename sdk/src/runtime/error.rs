//! Why a reconcile failed and is retried, and which answers of the API server refuse an
//! object for good.

/// A reconciliation failure that is worth retrying (API errors, conflicts). Terminal
/// problems of the spec are not errors: they become conditions, and the runtime waits for
/// the spec to change.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Anything else that may pass on retry.
    #[error("{0}")]
    Other(String),
    /// The leader term ended while the reconcile waited: it stops before writing (another
    /// replica may lead by now), and the next term reconciles again.
    #[error("the leader term ended during the reconcile")]
    TermEnded,
}

/// HTTP codes with which the API server or an admission webhook refuses an object for
/// what it is (not for load or a conflict): invalid (400, 422), forbidden by a webhook or
/// policy (403), or a kind or namespace that does not exist (404).
pub(crate) fn is_refusal(code: u16) -> bool {
    [400, 403, 404, 422].contains(&code)
}
