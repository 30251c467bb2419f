//! The cache layout of `huggingface_hub` (hfpy = huggingface/huggingface_hub@ee0a4510,
//! `src/huggingface_hub/file_download.py`), as pure functions:
//!
//! ```text
//! <cache>/models--{org}--{name}/
//!   blobs/<etag>                      the content of a file, named by its etag
//!   snapshots/<commit>/<path>         relative symlink to ../../blobs/<etag> (one ../ per segment)
//!   refs/<revision>                   the commit the revision named, written atomically
//! <cache>/.locks/models--{org}--{name}/<etag>.lock
//! ```
//!
//! Every name that comes from a user or from the hub (repo id, revision, file path,
//! commit, etag) is checked here before it becomes part of a path, so nothing hostile
//! (absolute paths, `..`, backslashes, empty segments) ever reaches the file system.

use std::path::{Path, PathBuf};

use crate::Error;

/// Longest file path accepted inside a repository.
const MAX_PATH: usize = 4096;
/// Longest revision name accepted.
const MAX_REVISION: usize = 256;

/// A repository id, checked: `org/name` or a bare `name` (the hub's legacy repos), each
/// part 1 to 96 of `[A-Za-z0-9_.-]`, neither starting nor ending with `-` or `.`, with
/// no `--` or `..` (hfpy `utils/_validators.py` `validate_repo_id`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RepoId(String);

impl RepoId {
    /// `id`, if it is a valid repository id.
    pub fn parse(id: &str) -> Result<Self, Error> {
        let invalid = |why| Error::invalid("repository id", id, why);
        let parts: Vec<&str> = id.split('/').collect();
        if parts.len() > 2 {
            return Err(invalid("it has more than one `/`"));
        }
        for part in &parts {
            if part.is_empty() || part.len() > 96 {
                return Err(invalid("each part has 1 to 96 characters"));
            }
            if !part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
            {
                return Err(invalid(
                    "only letters, digits, `_`, `.` and `-` are allowed",
                ));
            }
            if part.starts_with(['-', '.']) || part.ends_with(['-', '.']) {
                return Err(invalid("a part may not start or end with `-` or `.`"));
            }
            if part.contains("--") || part.contains("..") {
                return Err(invalid("`--` and `..` are not allowed"));
            }
        }
        Ok(Self(id.to_string()))
    }

    /// The id as the hub spells it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The repository's folder in the cache: `models--{org}--{name}`.
    pub fn folder(&self) -> String {
        format!("models--{}", self.0.replace('/', "--"))
    }
}

impl std::fmt::Display for RepoId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The segments of a relative path, if every one is a plain name: no absolute path, no
/// empty segment (`a//b`, a trailing `/`), no `.` or `..`, no backslash or NUL.
fn segments<'a>(what: &'static str, path: &'a str, max: usize) -> Result<Vec<&'a str>, Error> {
    let invalid = |why| Error::invalid(what, path, why);
    if path.is_empty() || path.len() > max {
        return Err(invalid("empty or too long"));
    }
    if path.contains(['\\', '\0']) {
        return Err(invalid("backslashes and NUL are not allowed"));
    }
    if path.starts_with('/') {
        return Err(invalid("absolute paths are not allowed"));
    }
    let parts: Vec<&str> = path.split('/').collect();
    for part in &parts {
        match *part {
            "" => return Err(invalid("empty segments are not allowed")),
            "." | ".." => return Err(invalid("`.` and `..` are not allowed")),
            _ => {}
        }
    }
    Ok(parts)
}

/// Checks a file path inside a repository (as the hub lists it, `a/b.safetensors`).
pub fn check_file_path(path: &str) -> Result<(), Error> {
    segments("file path", path, MAX_PATH).map(|_| ())
}

/// Checks a revision (branch, tag, `refs/pr/1`, or a commit): it names `refs/<revision>`.
pub fn check_revision(revision: &str) -> Result<(), Error> {
    segments("revision", revision, MAX_REVISION).map(|_| ())
}

/// Whether `s` is a commit id: 40 lowercase hex digits.
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Checks an etag: a git blob sha1 (40 hex) or a sha256 (64 hex), lowercase; it names a
/// blob file.
pub fn check_etag(etag: &str) -> Result<(), Error> {
    if matches!(etag.len(), 40 | 64) && etag.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        Ok(())
    } else {
        Err(Error::invalid(
            "etag",
            etag,
            "expected 40 or 64 lowercase hex digits",
        ))
    }
}

/// The paths of one repository in a cache directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoLayout {
    /// `<cache>/models--{org}--{name}`.
    pub root: PathBuf,
    /// `<cache>/.locks/models--{org}--{name}`.
    pub locks: PathBuf,
}

impl RepoLayout {
    /// The layout of `repo` under `cache_dir` (what `HF_HUB_CACHE` points at).
    pub fn new(cache_dir: &Path, repo: &RepoId) -> Self {
        Self {
            root: cache_dir.join(repo.folder()),
            locks: cache_dir.join(".locks").join(repo.folder()),
        }
    }

    /// `blobs/`.
    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }

    /// `blobs/<etag>` (`etag` checked by the caller with [`check_etag`]).
    pub fn blob(&self, etag: &str) -> PathBuf {
        self.blobs().join(etag)
    }

    /// `blobs/<etag>.incomplete`: a download in progress, resumed from its length.
    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.blobs().join(format!("{etag}.incomplete"))
    }

    /// `.locks/<repo folder>/<etag>.lock`, the lock huggingface_hub takes around a blob.
    pub fn blob_lock(&self, etag: &str) -> PathBuf {
        self.locks.join(format!("{etag}.lock"))
    }

    /// `snapshots/`.
    pub fn snapshots(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    /// `snapshots/<commit>`.
    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.snapshots().join(commit)
    }

    /// `snapshots/.<commit>.staging`: a snapshot being built, at the same depth as the
    /// snapshot so its relative links stay valid when it is renamed into place.
    pub fn staging(&self, commit: &str) -> PathBuf {
        self.snapshots().join(format!(".{commit}.staging"))
    }

    /// `refs/<revision>` (`revision` checked by [`check_revision`]).
    pub fn reference(&self, revision: &str) -> PathBuf {
        self.root.join("refs").join(revision)
    }
}

/// The target of the link `snapshots/<commit>/<path>` to `blobs/<etag>`: one `../` per
/// segment of `path`, plus one for `<commit>` (huggingface_hub makes the same link with
/// `os.path.relpath`, file_download.py `_create_symlink`).
pub fn link_target(path: &str, etag: &str) -> Result<PathBuf, Error> {
    let depth = segments("file path", path, MAX_PATH)?.len();
    check_etag(etag)?;
    let mut target = "../".repeat(depth + 1);
    target.push_str("blobs/");
    target.push_str(etag);
    Ok(PathBuf::from(target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_name_their_folder_and_hostile_ones_are_refused() {
        let repo = RepoId::parse("Qwen/Qwen3-0.6B").unwrap();
        assert_eq!(repo.folder(), "models--Qwen--Qwen3-0.6B");
        assert_eq!(RepoId::parse("gpt2").unwrap().folder(), "models--gpt2");
        for hostile in [
            "", "/", "a/", "/a", "a/b/c", "../x", "a/..", "a\\b", "a b", "a/.b", "a--b/c",
            "a..b/c", "-a/b", "a/b-", "a/b\0",
        ] {
            assert!(RepoId::parse(hostile).is_err(), "{hostile:?}");
        }
        assert!(RepoId::parse(&"a".repeat(97)).is_err());
    }

    #[test]
    fn hostile_file_paths_and_revisions_are_refused() {
        for ok in [
            "config.json",
            "a/b/c.safetensors",
            "..a",
            "a..",
            ".gitattributes",
        ] {
            check_file_path(ok).unwrap();
        }
        for hostile in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/./b",
            ".",
            "..",
            "a//b",
            "a/",
            "a\\b",
            "..\\x",
            "a\0b",
        ] {
            assert!(check_file_path(hostile).is_err(), "{hostile:?}");
        }
        check_revision("main").unwrap();
        check_revision("refs/pr/1").unwrap();
        for hostile in ["", "../main", "/main", "a//b", "main/", "a\\b"] {
            assert!(check_revision(hostile).is_err(), "{hostile:?}");
        }
        assert!(check_revision(&"a".repeat(257)).is_err());
    }

    #[test]
    fn etags_and_commits_are_plain_hex() {
        check_etag(&"a".repeat(40)).unwrap();
        check_etag(&"0".repeat(64)).unwrap();
        for bad in [
            "",
            "../x",
            &"A".repeat(40),
            &"a".repeat(41),
            &"g".repeat(64),
        ] {
            assert!(check_etag(bad).is_err(), "{bad:?}");
        }
        assert!(is_commit(&"0123456789abcdef".repeat(3)[..40]));
        assert!(!is_commit("main"));
        assert!(!is_commit(&"0".repeat(64)));
    }

    #[test]
    fn links_climb_one_level_per_segment_to_the_blob() {
        let etag = "e".repeat(64);
        assert_eq!(
            link_target("config.json", &etag).unwrap(),
            PathBuf::from(format!("../../blobs/{etag}"))
        );
        assert_eq!(
            link_target("a/b/model.safetensors", &etag).unwrap(),
            PathBuf::from(format!("../../../../blobs/{etag}"))
        );
        // Resolved from the link's directory, the target is the blob.
        let layout = RepoLayout::new(Path::new("/c"), &RepoId::parse("o/n").unwrap());
        let link_dir = layout.snapshot(&"1".repeat(40)).join("a/b");
        let resolved = link_dir.join(link_target("a/b/m", &etag).unwrap());
        assert_eq!(normalize(&resolved), layout.blob(&etag));
        assert!(link_target("../x", &etag).is_err());
        assert!(link_target("x", "../../etc").is_err());
    }

    /// `a/b/../c` -> `a/c`, lexically (the test's paths exist nowhere).
    fn normalize(p: &Path) -> PathBuf {
        let mut out = PathBuf::new();
        for c in p.components() {
            if c == std::path::Component::ParentDir {
                out.pop();
            } else {
                out.push(c);
            }
        }
        out
    }
}
