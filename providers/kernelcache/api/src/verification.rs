//! The verdict on a cache's signature (KernelCaches and `oci://` ModelCaches alike), apart
//! from both kinds so each can name it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Result of verifying the pinned digest's signature.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    /// The policy mode used.
    pub mode: VerificationMode,
    /// Whether a signature satisfied the policy. With mode `disabled` this is false and
    /// the cache is usable anyway (development only).
    pub verified: bool,
    /// The signer (key fingerprint, certificate subject or identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    /// Why verification failed, or a note about the mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The policy this verdict was reached under (`<uid>/<generation>` of the
    /// KernelCachePolicy): a verdict under another policy is reached again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<String>,
    /// The value of the `cache.kubeairunway.ai/reverify` annotation this verdict answered:
    /// setting the annotation to a new value makes the controller verify again at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverify_request: Option<String>,
}

/// How cache images are verified.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum VerificationMode {
    /// Cosign signatures by one of the given public keys.
    #[default]
    Key,
    /// Keyless (Fulcio certificate + Rekor bundle) with a pinned issuer and subject,
    /// verified offline against a trust root.
    Keyless,
    /// Signatures by certificates chaining to a CA bundle, subject matching a pattern
    /// (works air-gapped).
    Certificate,
    /// No verification (development only; shown in every status).
    Disabled,
}
