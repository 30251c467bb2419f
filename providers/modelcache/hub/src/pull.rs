//! A whole revision into the cache: resolve it, pick the files (`include` patterns),
//! check the disk, fetch the blobs (a bounded number at once), then publish
//! `snapshots/<commit>` at once and, when the revision is a name and not the commit,
//! `refs/<revision>` (as hfpy `_snapshot_download.py` does, after the snapshot here so a
//! ref never names a snapshot that is not there). A snapshot is never visible half-made:
//! it is built in `snapshots/.<commit>.staging` and renamed into place; files added to a
//! snapshot that exists (another `include`) appear one by one, each link renamed into
//! place. Old snapshots are kept: a revision that moved leaves the previous commit usable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use futures::{StreamExt as _, TryStreamExt as _};

use crate::Error;
use crate::client::{Hub, HubFile, RevisionInfo};
use crate::download::{fetch_blob, lock};
use crate::layout::{RepoId, RepoLayout, check_revision, link_target};

/// How to pull.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullOptions {
    /// Only files matching one of these patterns (fnmatch-like: `*` crosses `/`, a
    /// pattern ending with `/` means the folder's files); empty: every file.
    pub include: Vec<String>,
    /// Files downloaded at once (at least 1).
    pub parallel: usize,
    /// Retries of an interrupted file, each resuming from the bytes on disk.
    pub retries: u32,
    /// Refuse to start when the file system has less room than the missing bytes.
    pub check_space: bool,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            include: Vec::new(),
            parallel: 4,
            retries: 5,
            check_space: true,
        }
    }
}

/// One file of a pull.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileReport {
    /// The path in the repository.
    pub path: String,
    /// Its size.
    pub size: u64,
    /// Its etag (blob name).
    pub etag: String,
    /// Bytes received for it in this pull (0 when cached; more than `size` when an
    /// attempt restarted).
    pub received: u64,
    /// Its blob was already in the cache.
    pub cached: bool,
    /// Attempts that resumed a partial download with `Range`.
    pub resumed: u32,
}

/// What a pull did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullReport {
    /// The repository.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// The commit it named.
    pub commit: String,
    /// The cache directory (`HF_HUB_CACHE`).
    pub cache_dir: PathBuf,
    /// `snapshots/<commit>`: the model's directory.
    pub snapshot: PathBuf,
    /// The files, in the hub's order.
    pub files: Vec<FileReport>,
    /// Bytes of the files pulled.
    pub bytes_total: u64,
    /// Bytes received from the hub.
    pub bytes_received: u64,
}

/// The files `include` selects, with hfpy's semantics (`utils/_paths.py`
/// `filter_repo_objects`: Python's `fnmatch`, where `*` crosses `/`; a pattern ending with
/// `/` gets `*` appended).
pub fn select<'a>(files: &'a [HubFile], include: &[String]) -> Result<Vec<&'a HubFile>, Error> {
    if include.is_empty() {
        return Ok(files.iter().collect());
    }
    let mut set = globset::GlobSetBuilder::new();
    for pattern in include {
        let pattern = if pattern.ends_with('/') {
            format!("{pattern}*")
        } else {
            pattern.clone()
        };
        let glob = globset::GlobBuilder::new(&pattern)
            .literal_separator(false)
            .backslash_escape(false)
            .build()
            .map_err(|_| Error::invalid("include pattern", &pattern, "not a glob"))?;
        set.add(glob);
    }
    let set = set
        .build()
        .map_err(|_| Error::invalid("include patterns", &include.join(" "), "not globs"))?;
    Ok(files.iter().filter(|f| set.is_match(&f.path)).collect())
}

/// Bytes of `files`, each blob once (files with the same content share a blob): what
/// they take in the cache.
pub fn unique_bytes(files: &[&HubFile]) -> u64 {
    let by_etag: BTreeMap<&str, u64> = files.iter().map(|f| (f.etag(), f.size)).collect();
    by_etag.values().sum()
}

/// Bytes still to download for `files` (missing blobs, less what their partial
/// downloads hold), each blob once.
pub fn missing_bytes(layout: &RepoLayout, files: &[&HubFile]) -> u64 {
    let mut by_etag = BTreeMap::new();
    for f in files {
        by_etag.insert(f.etag(), f.size);
    }
    by_etag
        .into_iter()
        .filter(|(etag, _)| !layout.blob(etag).is_file())
        .map(|(etag, size)| {
            let partial = std::fs::metadata(layout.incomplete(etag)).map_or(0, |m| m.len());
            size.saturating_sub(partial)
        })
        .sum()
}

/// Bytes this user may still write under `dir`.
pub fn available(dir: &Path) -> Result<u64, Error> {
    let s = rustix::fs::statvfs(dir).map_err(|e| Error::io(dir, e.into()))?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

/// Pulls `revision` of `repo` into `cache_dir` (the `HF_HUB_CACHE` directory).
pub async fn pull(
    hub: &Hub,
    cache_dir: &Path,
    repo: &RepoId,
    revision: &str,
    options: &PullOptions,
) -> Result<PullReport, Error> {
    check_revision(revision)?;
    let info = hub.revision(repo, revision).await?;
    pull_resolved(hub, cache_dir, repo, revision, &info, options).await
}

/// Pulls `revision` of `repo`, already resolved to `info` (by [`Hub::revision`]: a
/// caller that decides from the file list first, e.g. against a budget, resolves once).
pub async fn pull_resolved(
    hub: &Hub,
    cache_dir: &Path,
    repo: &RepoId,
    revision: &str,
    info: &RevisionInfo,
    options: &PullOptions,
) -> Result<PullReport, Error> {
    check_revision(revision)?;
    let files = select(&info.files, &options.include)?;
    if files.is_empty() {
        return Err(Error::invalid(
            "include patterns",
            &options.include.join(" "),
            "they match no file of the revision",
        ));
    }
    let layout = RepoLayout::new(cache_dir, repo);
    let blobs = layout.blobs();
    tokio::fs::create_dir_all(&blobs)
        .await
        .map_err(|e| Error::io(&blobs, e))?;
    if options.check_space {
        let needed = missing_bytes(&layout, &files);
        let available = available(&blobs)?;
        if needed > available {
            return Err(Error::NoSpace {
                dir: blobs,
                needed,
                available,
            });
        }
    }

    // Each blob once (files with the same content share it), `parallel` at a time.
    let mut unique: BTreeMap<&str, &HubFile> = BTreeMap::new();
    for f in &files {
        unique.entry(f.etag()).or_insert(f);
    }
    // The futures are made before the stream (not by a closure in it), so that a pull
    // is `Send` and can run in a spawned task.
    let fetches: Vec<_> = unique
        .into_values()
        .map(|f| fetch_one(hub, repo, &info.commit, f, &layout, options.retries))
        .collect();
    let fetched: BTreeMap<String, crate::download::Fetched> = futures::stream::iter(fetches)
        .buffer_unordered(options.parallel.max(1))
        .try_collect()
        .await?;

    // Every blob already on disk (another cache's pull, maybe with another token): no
    // request proved this token may read the repository, and the hub lists a gated
    // repository's files to anyone. One file request does.
    if fetched.values().all(|f| f.cached)
        && let Some(first) = files.iter().min_by_key(|f| f.path.as_str())
    {
        hub.check_access(repo, &info.commit, &first.path).await?;
    }
    let links: Vec<(String, String)> = files
        .iter()
        .map(|f| (f.path.clone(), f.etag().to_string()))
        .collect();
    let snapshot = publish_snapshot(&layout, &info.commit, &links).await?;
    if revision != info.commit {
        write_ref(&layout, revision, &info.commit).await?;
    }

    let mut reports = Vec::with_capacity(files.len());
    let mut counted = std::collections::BTreeSet::new();
    for f in &files {
        let got = fetched.get(f.etag()).copied().unwrap_or_default();
        // A blob shared by two files was received once: counted for the first.
        let first = counted.insert(f.etag());
        reports.push(FileReport {
            path: f.path.clone(),
            size: f.size,
            etag: f.etag().to_string(),
            received: if first { got.received } else { 0 },
            cached: got.cached || !first,
            resumed: if first { got.resumed } else { 0 },
        });
    }
    Ok(PullReport {
        repo: repo.to_string(),
        revision: revision.to_string(),
        commit: info.commit.clone(),
        cache_dir: cache_dir.to_path_buf(),
        snapshot,
        bytes_total: reports.iter().map(|f| f.size).sum(),
        bytes_received: reports.iter().map(|f| f.received).sum(),
        files: reports,
    })
}

/// One blob of a pull, with its etag.
async fn fetch_one(
    hub: &Hub,
    repo: &RepoId,
    commit: &str,
    file: &HubFile,
    layout: &RepoLayout,
    retries: u32,
) -> Result<(String, crate::download::Fetched), Error> {
    let fetched = fetch_blob(hub, repo, commit, file, layout, retries).await?;
    Ok((file.etag().to_string(), fetched))
}

/// Links `files` ((path, etag) of blobs already in `blobs/`) into `snapshots/<commit>`:
/// a new snapshot is built aside and renamed into place; an existing one gets its missing
/// links, each renamed into place. Shared with OCI model artifacts, whose files land in
/// the same layout.
pub async fn publish_snapshot(
    layout: &RepoLayout,
    commit: &str,
    files: &[(String, String)],
) -> Result<PathBuf, Error> {
    let links: Vec<(String, PathBuf)> = files
        .iter()
        .map(|(path, etag)| Ok((path.clone(), link_target(path, etag)?)))
        .collect::<Result<_, Error>>()?;
    let snapshot = layout.snapshot(commit);
    let staging = layout.staging(commit);
    // One pull at a time builds a commit's snapshot (the staging directory is shared).
    tokio::fs::create_dir_all(&layout.locks)
        .await
        .map_err(|e| Error::io(&layout.locks, e))?;
    let _lock = lock(&layout.locks.join(format!("{commit}.snapshot.lock"))).await?;
    let target = snapshot.clone();
    tokio::task::spawn_blocking(move || {
        if !target.is_dir() {
            if staging.exists() {
                std::fs::remove_dir_all(&staging).map_err(|e| Error::io(&staging, e))?;
            }
            link_all(&staging, &links)?;
            match std::fs::rename(&staging, &target) {
                Ok(()) => return Ok(()),
                // Published meanwhile by another pull: add to it below.
                Err(_) if target.is_dir() => {
                    let _ = std::fs::remove_dir_all(&staging);
                }
                Err(e) => return Err(Error::io(&target, e)),
            }
        }
        link_all(&target, &links)
    })
    .await
    .map_err(|e| Error::io(&snapshot, std::io::Error::other(e)))??;
    Ok(snapshot)
}

/// Creates each missing link under `dir`, through a temporary name and a rename.
fn link_all(dir: &Path, links: &[(String, PathBuf)]) -> Result<(), Error> {
    for (path, target) in links {
        let link = dir.join(path);
        if link.symlink_metadata().is_ok() {
            continue;
        }
        let parent = link.parent().unwrap_or(dir);
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        let name = link
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = parent.join(format!(".{name}.link-tmp"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &link).map_err(|e| Error::io(&link, e))?;
    }
    Ok(())
}

/// Writes `refs/<revision>` = `commit` through a temporary file and a rename.
pub async fn write_ref(layout: &RepoLayout, revision: &str, commit: &str) -> Result<(), Error> {
    let path = layout.reference(revision);
    let parent = path
        .parent()
        .map_or_else(|| layout.root.join("refs"), Path::to_path_buf);
    tokio::fs::create_dir_all(&parent)
        .await
        .map_err(|e| Error::io(&parent, e))?;
    let tmp = parent.join(format!(
        ".{}.tmp-{}",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    tokio::fs::write(&tmp, commit)
        .await
        .map_err(|e| Error::io(&tmp, e))?;
    tokio::fs::rename(&tmp, &path)
        .await
        .map_err(|e| Error::io(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::Expected;

    fn file(path: &str) -> HubFile {
        HubFile {
            path: path.into(),
            size: 1,
            expected: Expected::GitSha1("a".repeat(40)),
        }
    }

    #[test]
    fn include_patterns_behave_like_fnmatch() {
        let files: Vec<HubFile> = [
            "config.json",
            "model.safetensors",
            "original/consolidated.pth",
            "sub/dir/tokenizer.json",
        ]
        .into_iter()
        .map(file)
        .collect();
        let picked = |patterns: &[&str]| -> Vec<String> {
            let patterns: Vec<String> = patterns.iter().map(|p| (*p).to_string()).collect();
            select(&files, &patterns)
                .unwrap()
                .into_iter()
                .map(|f| f.path.clone())
                .collect()
        };
        assert_eq!(picked(&[]).len(), 4);
        assert_eq!(
            picked(&["*.json"]),
            ["config.json", "sub/dir/tokenizer.json"]
        );
        assert_eq!(picked(&["original/"]), ["original/consolidated.pth"]);
        assert_eq!(
            picked(&["*.safetensors", "config.jso?"]),
            ["config.json", "model.safetensors"]
        );
        assert!(picked(&["nothing*"]).is_empty());
    }

    #[test]
    fn missing_bytes_count_each_blob_once_less_what_is_on_disk() {
        let cache = tempfile::tempdir().unwrap();
        let layout = RepoLayout::new(cache.path(), &RepoId::parse("o/n").unwrap());
        let blob = |etag: char, size| HubFile {
            path: format!("{etag}.bin"),
            size,
            expected: Expected::Sha256(etag.to_string().repeat(64)),
        };
        let (a, a_again, b, c) = (blob('a', 100), blob('a', 100), blob('b', 50), blob('c', 7));
        std::fs::create_dir_all(layout.blobs()).unwrap();
        std::fs::write(layout.incomplete(b.etag()), [0u8; 20]).unwrap();
        std::fs::write(layout.blob(c.etag()), [0u8; 7]).unwrap();
        assert_eq!(missing_bytes(&layout, &[&a, &a_again, &b, &c]), 100 + 30);
        assert_eq!(unique_bytes(&[&a, &a_again, &b, &c]), 100 + 50 + 7);
    }
}
