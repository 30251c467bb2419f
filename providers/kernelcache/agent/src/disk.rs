//! The cache root on disk: `<root>/<namespace>/<name>/<digest>` directories (each complete,
//! since extraction renames a checked directory into place), leftovers of interrupted
//! work (`.staging-*`, and `.downloads/` of versions that downloaded a layer to a file
//! before extracting it), and removal that stays inside the root.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Component, Path};

use super::plan::{Key, OnDisk, valid_digest};
use kubeairunway_kernelcache_artifact::files;
use kubeairunway_kernelcache_artifact::image::{self, CacheType};

/// Remove what interrupted work left: `.staging-*` directories (and `.downloads/` of
/// earlier versions).
pub fn clean_leftovers(root: &Path) -> io::Result<usize> {
    let mut removed = 0;
    let entries = match fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == ".downloads" || name.starts_with(".staging-") {
            remove_any(&entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// The cache digest directories under `root` (real directories only; symbolic links and
/// names that are not a namespace, a name and a digest are ignored).
pub fn scan(root: &Path) -> io::Result<Vec<Key>> {
    let mut keys = Vec::new();
    for (namespace, ns_dir) in subdirs(root)? {
        for (name, name_dir) in subdirs(&ns_dir)? {
            for (digest_dir, _) in subdirs(&name_dir)? {
                let digest = digest_dir.replacen('-', ":", 1);
                if valid_digest(&digest) {
                    keys.push(Key {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        digest,
                    });
                }
            }
        }
    }
    keys.sort();
    Ok(keys)
}

fn subdirs(dir: &Path) -> io::Result<Vec<(String, std::path::PathBuf)>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        // file_type does not follow symbolic links.
        if name.starts_with('.') || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        out.push((name, entry.path()));
    }
    Ok(out)
}

/// Read a staged cache: the targets its manifest lists and the bytes of its files.
pub fn read(dir: &Path) -> Result<OnDisk, String> {
    let cache_type = [CacheType::Triton, CacheType::Vllm]
        .into_iter()
        .find(|t| {
            dir.join(t.manifest_path())
                .symlink_metadata()
                .is_ok_and(|m| m.is_file())
        })
        .ok_or_else(|| format!("{} holds no cache manifest", dir.display()))?;
    let manifest = files::read_bounded(
        &dir.join(cache_type.manifest_path()),
        image::MAX_MANIFEST_BYTES,
    )
    .map_err(|e| format!("reading the manifest in {}: {e}", dir.display()))?;
    let targets = image::manifest_targets(cache_type, &manifest).map_err(|e| e.to_string())?;
    let size_bytes = size(dir).map_err(|e| format!("measuring {}: {e}", dir.display()))?;
    Ok(OnDisk {
        targets,
        size_bytes,
    })
}

/// Bytes of the regular files below `dir` (links are not followed).
pub fn size(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d)? {
            let entry = entry?;
            let meta = entry.path().symlink_metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    Ok(total)
}

/// Delete the directory of `key` and the namespace and name directories it leaves empty.
/// Every path component below `root` must be a real directory (never a link), so nothing
/// outside the root is touched.
pub fn remove(root: &Path, key: &Key) -> io::Result<()> {
    let dir = key.dir(root);
    let relative = dir
        .strip_prefix(root)
        .map_err(|_| io::Error::other("cache directory outside the root"))?;
    if relative.components().count() != 3
        || relative
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(io::Error::other(format!(
            "refusing to remove {}: not <namespace>/<name>/<digest>",
            relative.display()
        )));
    }
    let mut at = root.to_path_buf();
    for component in relative.components() {
        at.push(component);
        match at.symlink_metadata() {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(io::Error::other(format!(
                    "refusing to remove {}: {} is not a directory",
                    dir.display(),
                    at.display()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    // remove_dir_all removes links inside, never what they point to.
    fs::remove_dir_all(&dir)?;
    for parent in [dir.parent(), dir.parent().and_then(Path::parent)]
        .into_iter()
        .flatten()
    {
        if parent == root || fs::remove_dir(parent).is_err() {
            break;
        }
    }
    Ok(())
}

fn remove_any(path: &Path) -> io::Result<()> {
    if path.symlink_metadata()?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

/// When the cache of `key` was last used: its directory's modification time, which
/// [`mark_used`] moves while pods use it (else it is when the cache was staged).
pub fn last_used(root: &Path, key: &Key) -> io::Result<std::time::SystemTime> {
    key.dir(root).symlink_metadata()?.modified()
}

/// Record that the cache of `key` is in use at `now` (its directory's modification
/// time; nothing inside changes).
pub fn mark_used(root: &Path, key: &Key, now: std::time::SystemTime) -> io::Result<()> {
    let dir = key.dir(root);
    if !dir.symlink_metadata()?.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    fs::File::open(&dir)?.set_modified(now)
}

/// Read every directory of `keys` not in `known` yet.
pub fn read_new(root: &Path, keys: &[Key], known: &mut BTreeMap<Key, Result<OnDisk, String>>) {
    known.retain(|k, _| keys.contains(k));
    for key in keys {
        if !known.contains_key(key) {
            known.insert(key.clone(), read(&key.dir(root)));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;

    use super::*;

    const DIGEST: &str = "sha256-1111111111111111111111111111111111111111111111111111111111111111";

    fn key(ns: &str, name: &str) -> Key {
        Key {
            namespace: ns.into(),
            name: name.into(),
            digest: DIGEST.replacen('-', ":", 1),
        }
    }

    #[test]
    fn scan_finds_digest_directories_and_skips_links_and_leftovers() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        fs::create_dir_all(r.join("ml/vadd").join(DIGEST)).unwrap();
        fs::create_dir_all(r.join("ml/vadd/not-a-digest")).unwrap();
        fs::create_dir_all(r.join(".staging-abc/ml")).unwrap();
        fs::create_dir_all(r.join(".downloads")).unwrap();
        fs::write(r.join(".downloads/blob"), b"x").unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir_all(outside.path().join("x").join(DIGEST)).unwrap();
        symlink(outside.path(), r.join("linked")).unwrap();
        assert_eq!(scan(r).unwrap(), [key("ml", "vadd")]);
        assert_eq!(clean_leftovers(r).unwrap(), 2);
        assert!(!r.join(".downloads").exists() && !r.join(".staging-abc").exists());
        assert_eq!(scan(Path::new("/nonexistent/root")).unwrap(), []);
    }

    #[test]
    fn remove_deletes_the_digest_and_empty_parents_only_inside_the_root() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let dir = key("ml", "vadd").dir(r);
        fs::create_dir_all(dir.join("io.triton.cache")).unwrap();
        fs::write(dir.join("io.triton.cache/f"), b"x").unwrap();
        fs::create_dir_all(r.join("ml/other")).unwrap();
        // A link inside the cache pointing outside: removed, its target kept.
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("precious"), b"keep").unwrap();
        symlink(outside.path(), dir.join("link")).unwrap();
        remove(r, &key("ml", "vadd")).unwrap();
        assert!(!r.join("ml/vadd").exists(), "empty name directory removed");
        assert!(r.join("ml/other").exists());
        assert!(outside.path().join("precious").exists());
        // Already gone: fine.
        remove(r, &key("ml", "vadd")).unwrap();
    }

    #[test]
    fn last_use_is_the_directory_time_that_marking_moves() {
        let root = tempfile::tempdir().unwrap();
        let k = key("ml", "vadd");
        fs::create_dir_all(k.dir(root.path())).unwrap();
        let then = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        mark_used(root.path(), &k, then).unwrap();
        assert_eq!(last_used(root.path(), &k).unwrap(), then);
        assert!(mark_used(root.path(), &key("ml", "gone"), then).is_err());
    }

    #[test]
    fn remove_refuses_a_linked_namespace() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir_all(outside.path().join("vadd").join(DIGEST)).unwrap();
        symlink(outside.path(), root.path().join("ml")).unwrap();
        let e = remove(root.path(), &key("ml", "vadd")).unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
        assert!(outside.path().join("vadd").join(DIGEST).exists());
        let e = remove(root.path(), &key("..", "vadd")).unwrap_err();
        assert!(e.to_string().contains("refusing"), "{e}");
    }

    #[test]
    fn read_takes_targets_from_the_manifest_and_measures_files() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("c");
        fs::create_dir_all(dir.join("io.vllm.manifest")).unwrap();
        fs::create_dir_all(dir.join("io.vllm.cache")).unwrap();
        let manifest = br#"{"vllm":[{"backend":"cuda","arch":"90","warp_size":32}]}"#;
        fs::write(dir.join("io.vllm.manifest/manifest.json"), manifest).unwrap();
        fs::write(dir.join("io.vllm.cache/blob"), vec![0u8; 1000]).unwrap();
        let d = read(&dir).unwrap();
        assert_eq!(d.targets[0].arch, "90");
        assert_eq!(d.size_bytes, 1000 + manifest.len() as u64);
        let e = read(root.path()).unwrap_err();
        assert!(e.contains("holds no cache manifest"), "{e}");

        // A manifest that is a link (to a valid manifest outside, or to /dev/zero) is
        // never followed: the directory is damaged.
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("manifest.json"), manifest).unwrap();
        for target in [
            outside.path().join("manifest.json"),
            PathBuf::from("/dev/zero"),
        ] {
            let linked = root.path().join("linked");
            let _ = fs::remove_dir_all(&linked);
            fs::create_dir_all(linked.join("io.vllm.manifest")).unwrap();
            symlink(&target, linked.join("io.vllm.manifest/manifest.json")).unwrap();
            let e = read(&linked).unwrap_err();
            assert!(e.contains("manifest"), "{e}");
        }
    }
}
