//! The content hashes the hub names files by (hfpy `utils/_verification.py`; the
//! `hf_hub_url` docstring): an LFS file's etag is the sha256 of its content, a regular
//! file's etag (its `blobId`) is its git blob id, `sha1("blob {len}\0" + content)`.

use sha1::Sha1;
use sha2::{Digest as _, Sha256};

/// The digest a file must have, by kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Expected {
    /// sha256 of the content (LFS files), lowercase hex.
    Sha256(String),
    /// git blob sha1 of the content (regular files), lowercase hex.
    GitSha1(String),
}

impl Expected {
    /// The hex digest, which is also the file's etag and blob name.
    pub fn hex(&self) -> &str {
        match self {
            Self::Sha256(h) | Self::GitSha1(h) => h,
        }
    }

    /// `sha256` or `git-sha1`, for messages.
    pub fn algorithm(&self) -> &'static str {
        match self {
            Self::Sha256(_) => "sha256",
            Self::GitSha1(_) => "git-sha1",
        }
    }

    /// A hasher for a file of `size` bytes (the git blob header needs the size first).
    pub fn hasher(&self, size: u64) -> Hasher {
        match self {
            Self::Sha256(_) => Hasher::Sha256(Sha256::new()),
            Self::GitSha1(_) => {
                let mut h = <Sha1 as sha1::Digest>::new();
                sha1::Digest::update(&mut h, format!("blob {size}\0").as_bytes());
                Hasher::GitSha1(h)
            }
        }
    }
}

/// A running hash of a file's content.
#[derive(Clone, Debug)]
pub enum Hasher {
    /// sha256.
    Sha256(Sha256),
    /// git blob sha1 (header already fed).
    GitSha1(Sha1),
}

impl Hasher {
    /// Feeds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            Self::Sha256(h) => h.update(bytes),
            Self::GitSha1(h) => sha1::Digest::update(h, bytes),
        }
    }

    /// The lowercase hex digest.
    pub fn finish(self) -> String {
        match self {
            Self::Sha256(h) => hex(&h.finalize()),
            Self::GitSha1(h) => hex(&sha1::Digest::finalize(h)),
        }
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The git blob id of `content` (what `git hash-object` prints).
pub fn git_blob_sha1(content: &[u8]) -> String {
    let mut h = Expected::GitSha1(String::new()).hasher(content.len() as u64);
    h.update(content);
    h.finish()
}

/// The sha256 of `content`, lowercase hex.
pub fn sha256(content: &[u8]) -> String {
    hex(&Sha256::digest(content))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_blob_ids_match_git_hash_object() {
        // `printf 'hello\n' | git hash-object --stdin`, `git hash-object /dev/null`.
        assert_eq!(
            git_blob_sha1(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(
            git_blob_sha1(b""),
            "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
        );
        // A plain sha1 of the same bytes is not the blob id.
        assert_ne!(
            git_blob_sha1(b"hello\n"),
            "f572d396fae9206628714fb2ce00f72e94f2258f"
        );
    }

    #[test]
    fn sha256_of_known_inputs_and_chunking_does_not_matter() {
        assert_eq!(
            sha256(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let content = b"weights weights weights";
        for expected in [
            Expected::Sha256(sha256(content)),
            Expected::GitSha1(git_blob_sha1(content)),
        ] {
            let mut h = expected.hasher(content.len() as u64);
            for chunk in content.chunks(5) {
                h.update(chunk);
            }
            assert_eq!(h.finish(), expected.hex(), "{}", expected.algorithm());
        }
    }
}
