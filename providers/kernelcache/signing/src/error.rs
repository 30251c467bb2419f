//! Why a signature was refused ([`VerifyError`]) or a cache image could not be made
//! ([`BuildError`]), and which of several refusals to show ([`first_passing`]).

use kubeairunway_kernelcache_artifact::registry::RegistryError;

/// Why an image's signature did not satisfy the policy.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The image reference does not parse, or is not pinned to a digest.
    #[error("invalid pinned reference {0:?}: {1}")]
    Reference(String, String),
    /// The policy itself is unusable (missing or unparsable keys, CA bundle, pattern).
    #[error("invalid verification policy: {0}")]
    Policy(String),
    /// The registry has no signature for the digest.
    #[error("no signature found for {0}")]
    NoSignature(String),
    /// Signatures exist, but none by a trusted key (wrong key, tampered signature).
    #[error("unsatisfied constraints: no signature by a trusted key ({0})")]
    Unsatisfied(String),
    /// The signing certificate does not chain to a trusted CA (or is expired, or not for
    /// code signing).
    #[error("certificate not trusted: {0}")]
    Untrusted(String),
    /// The certificate's subject does not match the policy.
    #[error("subject mismatch: {found} does not match {wanted}")]
    SubjectMismatch {
        /// The subjects (SANs) the certificate carries.
        found: String,
        /// The policy's pattern or exact subject.
        wanted: String,
    },
    /// The certificate's OIDC issuer does not match the policy.
    #[error("issuer mismatch: {found} is not {wanted}")]
    IssuerMismatch {
        /// The issuer the certificate names (or `none`).
        found: String,
        /// The policy's issuer.
        wanted: String,
    },
    /// The signature payload names another image than the pinned one.
    #[error("digest mismatch: the signature payload names {signed}, the image is {pinned}")]
    DigestMismatch {
        /// The digest in the signed payload.
        signed: String,
        /// The pinned digest.
        pinned: String,
    },
    /// The registry failed for good, or the signature object is malformed.
    #[error("registry: {0}")]
    Registry(String),
    /// The registry could not be reached, timed out, or answered `429` or `5xx`: no
    /// verdict, try again later.
    #[error("registry unavailable: {0}")]
    Unavailable(String),
}

impl VerifyError {
    /// Whether this is no verdict but a registry that may answer later.
    pub fn is_transient(&self) -> bool {
        matches!(self, VerifyError::Unavailable(_))
    }
}

impl From<RegistryError> for VerifyError {
    fn from(e: RegistryError) -> Self {
        if e.transient {
            VerifyError::Unavailable(e.message)
        } else {
            VerifyError::Registry(e.message)
        }
    }
}

/// How far a signature got before failing (for choosing which reason to show).
fn rank(e: &VerifyError) -> u8 {
    match e {
        VerifyError::Untrusted(_) => 1,
        VerifyError::SubjectMismatch { .. } | VerifyError::IssuerMismatch { .. } => 2,
        VerifyError::Unsatisfied(_) => 3,
        _ => 0,
    }
}

/// The first of `results` (one per signature) that passed; else the most telling refusal,
/// the one that got furthest ([`rank`]; the first among equals); else, with no signature
/// at all, [`VerifyError::NoSignature`] of `digest`.
pub(crate) fn first_passing(
    results: impl IntoIterator<Item = Result<String, VerifyError>>,
    digest: &str,
) -> Result<String, VerifyError> {
    let mut failure: Option<VerifyError> = None;
    for result in results {
        match result {
            Ok(signer) => return Ok(signer),
            Err(e) => {
                if failure.as_ref().is_none_or(|f| rank(&e) > rank(f)) {
                    failure = Some(e);
                }
            }
        }
    }
    Err(failure.unwrap_or_else(|| VerifyError::NoSignature(digest.to_string())))
}

/// Why a cache could not be packaged.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The directory is not a cache of the kind given.
    #[error("{0}")]
    NotACache(String),
    /// Reading the directory or writing the layer.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Pushing or signing.
    #[error("{0}")]
    Registry(String),
}

pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BuildError {
    let context = context.into();
    move |source| BuildError::Io { context, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_pass_wins_else_the_refusal_that_got_furthest() {
        let untrusted = || Err(VerifyError::Untrusted("chain".into()));
        let mismatch = || {
            Err(VerifyError::SubjectMismatch {
                found: "a".into(),
                wanted: "b".into(),
            })
        };
        let passed = first_passing([untrusted(), Ok("signer".into()), mismatch()], "d");
        assert_eq!(passed.unwrap(), "signer");
        let refused = first_passing([untrusted(), mismatch(), untrusted()], "d").unwrap_err();
        assert!(
            matches!(refused, VerifyError::SubjectMismatch { .. }),
            "{refused}"
        );
        let unsatisfied = first_passing(
            [mismatch(), Err(VerifyError::Unsatisfied("key".into()))],
            "d",
        )
        .unwrap_err();
        assert!(
            matches!(unsatisfied, VerifyError::Unsatisfied(_)),
            "{unsatisfied}"
        );
        let none = first_passing([], "sha256:ab").unwrap_err();
        assert!(matches!(none, VerifyError::NoSignature(d) if d == "sha256:ab"));
    }
}
