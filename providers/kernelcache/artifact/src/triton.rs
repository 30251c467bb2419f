//! Triton group files (`__grp__<kernel>.json`) list their members by absolute path as the
//! producer saw them (`/workspace/.triton/cache/<HASH>/<file>`). A cache is only a hit
//! where those paths resolve, so after extraction the agent rewrites them to the path the
//! serving pods see: `<mount>/<HASH>/<file>`.
//!
//! A layer being staged has its group files rewritten as they are extracted
//! ([`GroupFiles`]), each written once. A cache already on disk has them replaced by
//! write-then-rename ([`rewrite_group_files`], [`files::replace`]), never written in place:
//! a process killed half way leaves the old file or the new one, and a pod copying the
//! cache at that moment reads a whole file either way.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path};

use serde_json::Value;

use crate::extract::Rewrite;
use crate::files;
use crate::image::CacheType;

/// Group files larger than this are not Triton's (a few hundred bytes per kernel).
pub const MAX_GROUP_FILE_BYTES: u64 = 1 << 20;

/// Rewrite every `__grp__*.json` below `cache_dir` (an extracted `io.triton.cache`) so its
/// `child_paths` point below `mount` (the directory pods see as `TRITON_CACHE_DIR`).
/// Returns the number of files rewritten. Only a child in the group file's own directory
/// is rewritten; anything else is left as it was.
pub fn rewrite_group_files(cache_dir: &Path, mount: &str) -> std::io::Result<usize> {
    if !fs::symlink_metadata(cache_dir)?.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory",
            cache_dir.display()
        )));
    }
    let mut rewritten = 0;
    for entry in fs::read_dir(cache_dir)?.flatten() {
        let dir = entry.path();
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let Some(hash) = dir.file_name().and_then(|h| h.to_str()).map(str::to_string) else {
            continue;
        };
        files::remove_leftovers(&dir)?;
        for file in fs::read_dir(&dir)?.flatten() {
            if !is_group_file(Path::new(&file.file_name())) || !file.file_type()?.is_file() {
                continue;
            }
            let path = file.path();
            let text = files::read_bounded(&path, MAX_GROUP_FILE_BYTES)?;
            if let Some(new) = rewritten_group(&text, &hash, mount)? {
                let mode = fs::symlink_metadata(&path)?.permissions().mode() & 0o777;
                files::replace(&path, &new, mode)?;
                rewritten += 1;
            }
        }
    }
    Ok(rewritten)
}

/// The group files of a Triton layer rewritten to `mount` as the layer is extracted
/// ([`Rewrite`]): the files [`rewrite_group_files`] would rewrite after extraction,
/// `io.triton.cache/<HASH>/__grp__*.json`, with the same rule, written once. (A hard link
/// in the layer to a group file shares its target's content, rewritten for the target's
/// directory.)
#[derive(Clone, Copy, Debug)]
pub struct GroupFiles<'a> {
    /// The directory pods see as `TRITON_CACHE_DIR`.
    pub mount: &'a str,
}

impl Rewrite for GroupFiles<'_> {
    fn wants(&self, path: &Path) -> bool {
        let mut parts = path.components();
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (
                Some(Component::Normal(cache)),
                Some(Component::Normal(hash)),
                Some(Component::Normal(name)),
                None,
            ) => {
                cache == CacheType::Triton.cache_dir()
                    && hash.to_str().is_some()
                    && is_group_file(Path::new(name))
            }
            _ => false,
        }
    }

    fn max_bytes(&self) -> u64 {
        MAX_GROUP_FILE_BYTES
    }

    fn rewrite(&self, path: &Path, content: Vec<u8>) -> std::io::Result<Vec<u8>> {
        let hash = path
            .parent()
            .and_then(Path::file_name)
            .and_then(|h| h.to_str())
            .unwrap_or_default();
        Ok(rewritten_group(&content, hash, self.mount)?.unwrap_or(content))
    }
}

/// `__grp__*.json`.
fn is_group_file(name: &Path) -> bool {
    name.to_str().is_some_and(|n| n.starts_with("__grp__"))
        && name.extension().is_some_and(|e| e == "json")
}

/// The group file `text` of the directory `hash` pointed at `mount`, if that changes it
/// (a file that is not JSON is left as it is).
fn rewritten_group(text: &[u8], hash: &str, mount: &str) -> std::io::Result<Option<Vec<u8>>> {
    let Ok(mut group) = serde_json::from_slice::<Value>(text) else {
        return Ok(None);
    };
    if rewrite(&mut group, hash, mount) {
        Ok(Some(serde_json::to_vec(&group)?))
    } else {
        Ok(None)
    }
}

fn rewrite(group: &mut Value, hash: &str, mount: &str) -> bool {
    let Some(children) = group.get_mut("child_paths").and_then(Value::as_object_mut) else {
        return false;
    };
    let mut changed = false;
    for (child, path) in children.iter_mut() {
        let Some(old) = path.as_str() else { continue };
        let in_own_dir = Path::new(old)
            .parent()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            == Some(hash);
        if in_own_dir {
            let new = format!("{}/{hash}/{child}", mount.trim_end_matches('/'));
            if new != old {
                *path = Value::String(new);
                changed = true;
            }
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "MCELTMXFCSPAMZYLZ3C3WPPYYVTVR4QOYNE52X3X6FIH7Z6N6X5A";

    #[test]
    fn rewrites_the_real_rocm_group_file_to_the_mount() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(HASH);
        fs::create_dir_all(&dir).unwrap();
        let data = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/triton-rocm-vector-add/io.triton.cache")
            .join(HASH);
        fs::copy(
            data.join("__grp__add_kernel.json"),
            dir.join("__grp__add_kernel.json"),
        )
        .unwrap();
        fs::copy(data.join("add_kernel.json"), dir.join("add_kernel.json")).unwrap();

        assert_eq!(
            rewrite_group_files(tmp.path(), "/var/cache/kubeairunway/vadd/io.triton.cache/")
                .unwrap(),
            1
        );
        let group: Value =
            serde_json::from_slice(&fs::read(dir.join("__grp__add_kernel.json")).unwrap()).unwrap();
        let children = group["child_paths"].as_object().unwrap();
        assert_eq!(children.len(), 6);
        for (child, path) in children {
            assert_eq!(
                path,
                &Value::String(format!(
                    "/var/cache/kubeairunway/vadd/io.triton.cache/{HASH}/{child}"
                ))
            );
        }
        // Idempotent: a restarted agent finds nothing to change.
        assert_eq!(
            rewrite_group_files(tmp.path(), "/var/cache/kubeairunway/vadd/io.triton.cache")
                .unwrap(),
            0
        );
    }

    #[test]
    fn never_writes_through_a_link_and_never_leaves_half_a_file() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let group = br#"{"child_paths": {"k.json": "/producer/H/k.json"}}"#;
        fs::create_dir_all(outside.path().join("H")).unwrap();
        fs::write(outside.path().join("H/__grp__k.json"), group).unwrap();
        // The cache directory itself, a hash directory, or a group file as a link.
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("linked-cache")).unwrap();
        assert!(rewrite_group_files(&tmp.path().join("linked-cache"), "/m").is_err());
        let cache = tmp.path().join("cache");
        fs::create_dir_all(cache.join("H2")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("H"), cache.join("H")).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("H/__grp__k.json"),
            cache.join("H2/__grp__k.json"),
        )
        .unwrap();
        assert_eq!(rewrite_group_files(&cache, "/m").unwrap(), 0);
        assert_eq!(
            fs::read(outside.path().join("H/__grp__k.json")).unwrap(),
            group
        );
        // A temporary file of an interrupted rewrite is removed.
        fs::create_dir_all(cache.join("H3")).unwrap();
        fs::write(
            cache.join("H3/__grp__k.json"),
            br#"{"child_paths": {"k.json": "/p/H3/k.json"}}"#,
        )
        .unwrap();
        fs::write(
            cache.join(format!("H3/{}__grp__k.json", files::TEMP_PREFIX)),
            b"{\"chi",
        )
        .unwrap();
        assert_eq!(rewrite_group_files(&cache, "/m").unwrap(), 1);
        let names: Vec<String> = fs::read_dir(cache.join("H3"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["__grp__k.json"]);
    }

    /// Every file below `dir` with its content.
    fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
                    out.push((rel, fs::read(e.path()).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn group_files_rewritten_while_extracting_are_what_a_rewrite_after_makes() {
        use crate::extract::{self, Limits};
        let group = |dir: &str| {
            format!(
                r#"{{"child_paths": {{"k.json": "/workspace/.triton/cache/{dir}/k.json", "o.json": "/elsewhere/OTHER/o.json"}}}}"#
            )
        };
        let (h1, h2) = (group("H1"), group("ELSEWHERE"));
        let files: [(&str, &[u8]); 7] = [
            ("io.triton.cache/H1/__grp__k.json", h1.as_bytes()),
            ("io.triton.cache/H1/k.json", br#"{"name": "k"}"#),
            ("io.triton.cache/H2/__grp__k.json", h2.as_bytes()),
            ("io.triton.cache/H3/__grp__broken.json", b"{\"chi"),
            ("io.triton.cache/__grp__top.json", h1.as_bytes()),
            ("io.triton.cache/H1/deeper/__grp__k.json", h1.as_bytes()),
            ("io.triton.manifest/manifest.json", h1.as_bytes()),
        ];
        let gz = crate::testing::tar_gz(&files);
        let root = tempfile::tempdir().unwrap();
        let (during, after) = (root.path().join("during"), root.path().join("after"));
        let groups = GroupFiles { mount: "/m/" };
        let ok = |_: &Path| Ok::<(), extract::ExtractError>(());
        let a = extract::extract_checked(
            &gz[..],
            root.path(),
            &during,
            Limits::default(),
            Some(&groups),
            ok,
        )
        .unwrap();
        let b = extract::extract(&gz[..], root.path(), &after, Limits::default()).unwrap();
        assert_eq!(a, b, "counts are of the layer's content");
        assert_eq!(
            rewrite_group_files(&after.join("io.triton.cache"), "/m/").unwrap(),
            1
        );
        assert_eq!(tree(&during), tree(&after));
        let h1: Value = serde_json::from_slice(
            &fs::read(during.join("io.triton.cache/H1/__grp__k.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(h1["child_paths"]["k.json"], "/m/H1/k.json");
        assert_eq!(h1["child_paths"]["o.json"], "/elsewhere/OTHER/o.json");

        // A group file too large to be Triton's is refused, as after extraction.
        let big = vec![b' '; usize::try_from(MAX_GROUP_FILE_BYTES).unwrap() + 1];
        let gz = crate::testing::tar_gz(&[("io.triton.cache/H/__grp__k.json", &big)]);
        let target = root.path().join("big");
        let e = extract::extract_checked(
            &gz[..],
            root.path(),
            &target,
            Limits::default(),
            Some(&groups),
            ok,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("larger than the 1048576 bytes accepted"),
            "{e}"
        );
        assert!(!target.exists());
        extract::extract(&gz[..], root.path(), &target, Limits::default()).unwrap();
        assert!(rewrite_group_files(&target.join("io.triton.cache"), "/m").is_err());
    }

    #[test]
    fn leaves_foreign_paths_alone() {
        let mut group = serde_json::json!({"child_paths": {"a.json": "/somewhere/OTHER/a.json", "b.json": "/x/H/b.json"}});
        assert!(rewrite(&mut group, "H", "/m"));
        assert_eq!(group["child_paths"]["a.json"], "/somewhere/OTHER/a.json");
        assert_eq!(group["child_paths"]["b.json"], "/m/H/b.json");
    }
}
