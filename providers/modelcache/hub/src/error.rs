//! Why a pull failed: one error type for the crate, with whether a retry may help.

use std::path::PathBuf;

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A name from the user or the hub that cannot be used (never touches disk).
    #[error("invalid {what} {value:?}: {why}")]
    Invalid {
        /// What was checked (repository id, revision, file path, etag).
        what: &'static str,
        /// The value, as given.
        value: String,
        /// Why it is refused.
        why: &'static str,
    },
    /// The repository is gated and the request carried no token with access.
    #[error("{repo} is a gated repository: {}", if *with_token {
        "the token given has no access to it (accept its conditions on the hub with the token's account)"
    } else {
        "a token of an account that accepted its conditions is needed (--token-file)"
    })]
    Gated {
        /// The repository.
        repo: String,
        /// Whether a token was sent.
        with_token: bool,
    },
    /// No such repository (or a private one the token cannot see).
    #[error("repository {repo} not found (or private, and the token has no access to it)")]
    RepoNotFound {
        /// The repository.
        repo: String,
    },
    /// No such revision.
    #[error("revision {revision:?} not found in {repo}")]
    RevisionNotFound {
        /// The repository.
        repo: String,
        /// The revision asked for.
        revision: String,
    },
    /// No such file at that commit.
    #[error("{path} not found in {repo} at {commit}")]
    EntryNotFound {
        /// The repository.
        repo: String,
        /// The commit.
        commit: String,
        /// The file.
        path: String,
    },
    /// `401`/`403` without a more precise code.
    #[error("{what}: access refused (HTTP {status}); the token is missing, wrong or has no access")]
    Unauthorized {
        /// The request.
        what: String,
        /// The status code.
        status: u16,
    },
    /// Any other unexpected status.
    #[error("{what}: HTTP {status}")]
    Status {
        /// The request.
        what: String,
        /// The status code.
        status: u16,
    },
    /// The connection failed, timed out or broke.
    #[error("{what}: {message}")]
    Transport {
        /// The request.
        what: String,
        /// What failed.
        message: String,
    },
    /// The hub answered something that is not what the API says.
    #[error("{what}: {message}")]
    Protocol {
        /// The request.
        what: String,
        /// What is wrong.
        message: String,
    },
    /// A file's length is not the one listed.
    #[error("{path}: the hub sent {got} bytes where the listing says {expected}")]
    Size {
        /// The file.
        path: String,
        /// The listed size.
        expected: u64,
        /// The bytes received (at least; more are refused at the first one over).
        got: u64,
    },
    /// A file's content is not the one listed; its partial download was deleted.
    #[error(
        "{path}: content does not match the hub's listing: expected {algorithm} {expected}, got {actual}; the download was deleted"
    )]
    Digest {
        /// The file.
        path: String,
        /// `sha256` or `git-sha1`.
        algorithm: &'static str,
        /// The listed digest.
        expected: String,
        /// The digest of what arrived.
        actual: String,
    },
    /// The cache's file system has less room than the files need.
    #[error("not enough disk space in {dir}: {needed} bytes needed, {available} available")]
    NoSpace {
        /// The directory checked.
        dir: PathBuf,
        /// Bytes still to download.
        needed: u64,
        /// Bytes available to this user.
        available: u64,
    },
    /// A file-system operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn invalid(what: &'static str, value: &str, why: &'static str) -> Self {
        Self::Invalid {
            what,
            value: value.chars().take(300).collect(),
            why,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// Whether trying again may help: connection failures, timeouts, `429` and `5xx`.
    pub fn transient(&self) -> bool {
        match self {
            Self::Transport { .. } => true,
            Self::Status { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}
