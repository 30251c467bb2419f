//! What the agent removes from its hub cache (`<root>/hub`) once no ModelCache it holds
//! wants it: a repository folder (`models--org--name`) no wanted cache names, and, in a
//! folder every cache of which is `Ready`, the snapshots none of them is at (with the
//! refs naming them and the blobs no kept snapshot links to). A folder where a download
//! is not `Ready` (running, waiting, failed) keeps every snapshot: a changed revision
//! downloads the new commit before the old one goes.
//!
//! Several ModelCaches (other namespaces, revisions, `include` sets) share a folder, so
//! what is kept is the union over all of them. Only names directly below `<root>/hub/`
//! starting with `models--` are touched; a symlink is removed as a link, never followed.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;

use kubeairunway_kernelcache_api::model::{ModelCacheState, reasons};
use kubeairunway_kernelcache_api::names::hub_folder;

use super::decide::{Entry, Wanted};

/// The prefix of a repository folder of models in the hub cache.
const MODELS_PREFIX: &str = "models--";

/// Per repository folder, the snapshots to keep: `None` keeps them all (a download there
/// is not `Ready`), else the commits of its `Ready` caches.
pub type Keep = BTreeMap<String, Option<BTreeSet<String>>>;

/// What may be removed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Removal {
    /// A whole repository folder (and its lock folder).
    Folder(String),
    /// One snapshot of a folder, with the refs naming it and the blobs left unlinked.
    Snapshot {
        /// The repository folder.
        folder: String,
        /// The snapshot's commit.
        commit: String,
    },
}

/// What the wanted caches keep, from the report's `entries` (their state and commit).
/// A wanted cache with an invalid spec downloads nothing and keeps nothing.
pub fn keep(wanted: &[Wanted], entries: &[Entry]) -> Keep {
    let mut keep = Keep::new();
    for w in wanted.iter().filter(|w| w.invalid.is_none()) {
        let folder = hub_folder(&w.repo);
        let entry = entries.iter().find(|e| e.key == w.key);
        let ready = entry
            // A refresh downloads a new commit: its blobs, not linked yet, must stay.
            .filter(|e| {
                e.state == ModelCacheState::Ready
                    && e.reason != reasons::REFRESHING
                    && e.generation == w.generation
            })
            .and_then(|e| e.commit.clone());
        let slot = keep.entry(folder).or_insert_with(|| Some(BTreeSet::new()));
        match (ready, slot.as_mut()) {
            (Some(commit), Some(commits)) => {
                commits.insert(commit);
            }
            (None, _) => *slot = None,
            (Some(_), None) => {}
        }
    }
    keep
}

/// A name read from the disk that may be joined to a path below the hub cache: one
/// plain segment.
fn plain(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// What to remove from a hub cache holding `on_disk` (folder name: its snapshot names)
/// given `keep`. Staging snapshots (`.<commit>.staging`) belong to downloads and stay.
pub fn removals(on_disk: &BTreeMap<String, Vec<String>>, keep: &Keep) -> Vec<Removal> {
    let mut out = Vec::new();
    for (folder, snapshots) in on_disk {
        if !folder.starts_with(MODELS_PREFIX) || !plain(folder) {
            continue;
        }
        match keep.get(folder) {
            None => out.push(Removal::Folder(folder.clone())),
            Some(None) => {}
            Some(Some(commits)) => out.extend(
                snapshots
                    .iter()
                    .filter(|s| plain(s) && !s.starts_with('.') && !commits.contains(*s))
                    .map(|s| Removal::Snapshot {
                        folder: folder.clone(),
                        commit: s.clone(),
                    }),
            ),
        }
    }
    out
}

/// Whether `path` is a directory itself (not a symlink to one).
fn real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// The names in directory `path` (none when it is not a real directory).
fn names(path: &Path) -> Vec<String> {
    if !real_dir(path) {
        return Vec::new();
    }
    std::fs::read_dir(path)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The repository folders of the hub cache `hub` and their snapshots.
pub fn scan(hub: &Path) -> BTreeMap<String, Vec<String>> {
    names(hub)
        .into_iter()
        .filter(|n| n.starts_with(MODELS_PREFIX))
        .map(|n| {
            let snapshots = names(&hub.join(&n).join("snapshots"));
            (n, snapshots)
        })
        .collect()
}

/// Removes `path`: a symlink or file as itself, a directory with what is in it (the
/// standard library's removal does not follow symlinks). Absent is fine.
fn remove_path(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
    }
}

/// Carries out `removals` in the hub cache `hub`; the errors, by path.
pub fn remove(hub: &Path, removals: &[Removal]) -> Vec<(String, io::Error)> {
    let mut errors = Vec::new();
    let mut note = |path: &Path, r: io::Result<()>| {
        if let Err(e) = r {
            errors.push((path.display().to_string(), e));
        }
    };
    let mut touched: BTreeSet<&str> = BTreeSet::new();
    for r in removals {
        match r {
            Removal::Folder(folder) if plain(folder) => {
                let path = hub.join(folder);
                note(&path, remove_path(&path));
                let lock = hub.join(".locks").join(folder);
                note(&lock, remove_path(&lock));
            }
            Removal::Snapshot { folder, commit } if plain(folder) && plain(commit) => {
                let repo = hub.join(folder);
                if !real_dir(&repo) {
                    continue;
                }
                let path = repo.join("snapshots").join(commit);
                note(&path, remove_path(&path));
                remove_refs(&repo, commit, &mut note);
                touched.insert(folder);
            }
            _ => {}
        }
    }
    for folder in touched {
        remove_unlinked_blobs(&hub.join(folder), &mut note);
    }
    errors
}

/// The top-level refs of `repo` naming `commit` (a phase of [`remove`]).
fn remove_refs(repo: &Path, commit: &str, note: &mut impl FnMut(&Path, io::Result<()>)) {
    let refs = repo.join("refs");
    for name in names(&refs) {
        let path = refs.join(&name);
        let is_file = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
        if is_file && std::fs::read_to_string(&path).is_ok_and(|c| c.trim() == commit) {
            note(&path, std::fs::remove_file(&path));
        }
    }
}

/// The blobs of `repo` that no remaining snapshot links to (a phase of [`remove`]);
/// partial downloads (`.incomplete`) stay.
fn remove_unlinked_blobs(repo: &Path, note: &mut impl FnMut(&Path, io::Result<()>)) {
    let mut linked = BTreeSet::new();
    let mut stack: Vec<std::path::PathBuf> = names(&repo.join("snapshots"))
        .into_iter()
        .map(|s| repo.join("snapshots").join(s))
        .collect();
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_symlink() {
            if let Some(blob) = std::fs::read_link(&path)
                .ok()
                .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
            {
                linked.insert(blob);
            }
        } else if meta.is_dir() {
            stack.extend(names(&path).into_iter().map(|n| path.join(n)));
        }
    }
    let blobs = repo.join("blobs");
    for blob in names(&blobs) {
        if !linked.contains(&blob) && !blob.ends_with(".incomplete") {
            let path = blobs.join(&blob);
            note(&path, remove_path(&path));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::decide::Key;
    use kubeairunway_kernelcache_api::model::reasons;

    fn wanted(ns: &str, name: &str, repo: &str) -> Wanted {
        Wanted {
            key: Key {
                namespace: ns.into(),
                name: name.into(),
            },
            generation: 1,
            repo: repo.into(),
            oci: None,
            revision: "main".into(),
            include: Vec::new(),
            budget: None,
            token: false,
            invalid: None,
            verdict: kubeairunway_kernelcache_api::model::PullVerdict::Allowed,
            max_nodes: None,
        }
    }

    fn entry(w: &Wanted, state: ModelCacheState, commit: Option<&str>) -> Entry {
        Entry {
            key: w.key.clone(),
            generation: w.generation,
            state,
            reason: reasons::READY,
            message: None,
            commit: commit.map(Into::into),
            bytes: None,
        }
    }

    fn disk(list: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        list.iter()
            .map(|(f, s)| (f.to_string(), s.iter().map(ToString::to_string).collect()))
            .collect()
    }

    /// Two caches of one repository at two commits keep both; a folder nobody wants goes
    /// whole; a commit no Ready cache is at goes.
    #[test]
    fn a_shared_folder_keeps_every_wanted_commit() {
        let a = wanted("ns", "a", "acme/tiny");
        let b = wanted("other", "b", "acme/tiny");
        let entries = [
            entry(&a, ModelCacheState::Ready, Some("c1")),
            entry(&b, ModelCacheState::Ready, Some("c2")),
        ];
        let keep = keep(&[a, b], &entries);
        let on_disk = disk(&[
            ("models--acme--tiny", &["c1", "c2", "c0", ".c3.staging"]),
            ("models--acme--gone", &["c1"]),
        ]);
        assert_eq!(
            removals(&on_disk, &keep),
            vec![
                Removal::Folder("models--acme--gone".into()),
                Removal::Snapshot {
                    folder: "models--acme--tiny".into(),
                    commit: "c0".into()
                },
            ]
        );
    }

    /// A changed revision still downloading (or failed) keeps every snapshot of its
    /// folder, the old commit included, even where another cache of it is Ready.
    #[test]
    fn a_folder_being_refreshed_keeps_every_snapshot_and_blob() {
        // A refresh downloads the new commit of a moving revision while the entry stays
        // Ready at the old one: the new blobs, linked by no snapshot yet, must stay.
        let a = wanted("ns", "a", "acme/tiny");
        let refreshing = Entry {
            reason: reasons::REFRESHING,
            ..entry(&a, ModelCacheState::Ready, Some("old"))
        };
        let keep = keep(std::slice::from_ref(&a), &[refreshing]);
        assert_eq!(keep.get("models--acme--tiny"), Some(&None));
        let on_disk = disk(&[("models--acme--tiny", &["old", ".new.staging"])]);
        assert!(removals(&on_disk, &keep).is_empty());
    }

    #[test]
    fn a_folder_with_a_download_not_ready_keeps_every_snapshot() {
        let a = wanted("ns", "a", "acme/tiny");
        let b = wanted("ns", "b", "acme/tiny");
        let on_disk = disk(&[("models--acme--tiny", &["old", "other"])]);
        for state in [ModelCacheState::Downloading, ModelCacheState::Failed] {
            let entries = [
                entry(&a, state, Some("new")),
                entry(&b, ModelCacheState::Ready, Some("other")),
            ];
            let keep = keep(&[a.clone(), b.clone()], &entries);
            assert_eq!(keep.get("models--acme--tiny"), Some(&None));
            assert!(removals(&on_disk, &keep).is_empty());
        }
        // Once Ready at the new commit, the old one goes.
        let entries = [
            entry(&a, ModelCacheState::Ready, Some("new")),
            entry(&b, ModelCacheState::Ready, Some("other")),
        ];
        let on_disk = disk(&[("models--acme--tiny", &["old", "new", "other"])]);
        assert_eq!(
            removals(&on_disk, &keep(&[a, b], &entries)),
            vec![Removal::Snapshot {
                folder: "models--acme--tiny".into(),
                commit: "old".into()
            }]
        );
    }

    /// Names that are not one plain `models--` segment are never removed.
    #[test]
    fn hostile_and_foreign_names_are_left_alone() {
        let on_disk = disk(&[
            ("..", &[]),
            ("models--a/../../etc", &[]),
            ("datasets--acme--d", &[]),
            (".locks", &[]),
            ("models--a--b", &["..", "x/../y", ""]),
        ]);
        let a = wanted("ns", "a", "a/b");
        let keep = keep(
            std::slice::from_ref(&a),
            &[entry(&a, ModelCacheState::Ready, Some("c"))],
        );
        assert_eq!(removals(&on_disk, &keep), Vec::new());
    }

    /// On disk: a removed folder goes with its lock folder; a symlinked folder is
    /// removed as a link (its target stays); a removed snapshot takes its ref and the
    /// blobs only it linked to; a kept snapshot's blobs stay.
    #[cfg(unix)]
    #[test]
    fn removal_on_disk_never_follows_symlinks() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let hub = tmp.path().join("hub");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(outside.join("keep")).unwrap();
        std::fs::write(outside.join("keep/file"), "x").unwrap();
        let repo = hub.join("models--acme--tiny");
        for (commit, blob) in [("old", "b-old"), ("new", "b-new")] {
            std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
            symlink(
                format!("../../blobs/{blob}"),
                repo.join("snapshots").join(commit).join("w"),
            )
            .unwrap();
        }
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        for blob in ["b-old", "b-new", "b-x.incomplete"] {
            std::fs::write(repo.join("blobs").join(blob), "data").unwrap();
        }
        std::fs::write(repo.join("refs/v1"), "old").unwrap();
        std::fs::write(repo.join("refs/main"), "new").unwrap();
        let gone = hub.join("models--acme--gone");
        std::fs::create_dir_all(gone.join("snapshots")).unwrap();
        symlink(&outside, gone.join("snapshots/escape")).unwrap();
        std::fs::create_dir_all(hub.join(".locks/models--acme--gone")).unwrap();
        symlink(&outside, hub.join("models--acme--link")).unwrap();

        let a = wanted("ns", "a", "acme/tiny");
        let keep = keep(
            std::slice::from_ref(&a),
            &[entry(&a, ModelCacheState::Ready, Some("new"))],
        );
        let plan = removals(&scan(&hub), &keep);
        assert_eq!(plan.len(), 3, "{plan:?}");
        assert!(remove(&hub, &plan).is_empty());

        assert!(!gone.exists() && !hub.join(".locks/models--acme--gone").exists());
        assert!(std::fs::symlink_metadata(hub.join("models--acme--link")).is_err());
        assert!(outside.join("keep/file").exists(), "a symlink was followed");
        assert!(!repo.join("snapshots/old").exists());
        assert!(!repo.join("refs/v1").exists() && repo.join("refs/main").exists());
        assert!(!repo.join("blobs/b-old").exists());
        assert!(repo.join("blobs/b-new").exists());
        assert!(repo.join("blobs/b-x.incomplete").exists());
        assert!(repo.join("snapshots/new/w").exists());
    }
}
