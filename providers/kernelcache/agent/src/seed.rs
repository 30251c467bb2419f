//! `kernelcache-seed`, the init container the webhook adds: copy a staged cache from the
//! read-only source volume into the pod's writable directory.
//!
//! The pod must start whatever happens: a missing source (the cache is not staged on this
//! node) is normal and copies nothing; symlinks are skipped, never followed; the copy is
//! made writable by any user (directories `0777`, files `0666`), because the serving
//! container runs as whatever user its image says and adds entries on cache misses. A
//! failure half way leaves what was copied (every file is a complete copy or absent:
//! files are written under a temporary name and renamed).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// What a copy did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    /// Regular files copied.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Symlinks and special files skipped.
    pub skipped: u64,
}

/// Copy the tree at `from` into `to` (created if needed). `Ok(None)` when `from` does not
/// exist or is not a directory.
pub fn copy(from: &Path, to: &Path) -> io::Result<Option<Copied>> {
    match fs::symlink_metadata(from) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut copied = Copied::default();
    make_dir(to)?;
    walk(from, to, &mut copied)?;
    Ok(Some(copied))
}

fn make_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o777))
}

fn walk(from: &Path, to: &Path, copied: &mut Copied) -> io::Result<()> {
    let mut entries: Vec<_> = fs::read_dir(from)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(fs::DirEntry::file_name);
    for entry in entries {
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            make_dir(&target)?;
            walk(&entry.path(), &target, copied)?;
        } else if kind.is_file() {
            let partial = to.join(format!(".{}.partial", entry.file_name().to_string_lossy()));
            copied.bytes += fs::copy(entry.path(), &partial)?;
            fs::set_permissions(&partial, fs::Permissions::from_mode(0o666))?;
            fs::rename(&partial, &target)?;
            copied.files += 1;
        } else {
            tracing::warn!(path = %entry.path().display(), "skipping a link or special file");
            copied.skipped += 1;
        }
    }
    Ok(())
}

/// The whole `main` of `kernelcache-seed`: always exits successfully, so that a cache
/// problem never keeps the serving pod from starting.
pub fn main_with(from: &Path, to: &Path) {
    match copy(from, to) {
        Ok(Some(c)) => tracing::info!(
            from = %from.display(),
            files = c.files,
            bytes = c.bytes,
            skipped = c.skipped,
            "kernel cache copied"
        ),
        Ok(None) => tracing::info!(
            from = %from.display(),
            "no staged cache on this node; kernels compile at run time"
        ),
        Err(e) => tracing::error!(
            from = %from.display(),
            error = %e,
            "copying the kernel cache failed; kernels compile at run time"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_the_tree_writable_by_anyone_and_skips_links() {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir_all(src.path().join("HASH")).unwrap();
        fs::write(src.path().join("HASH/add_kernel.json"), b"{}").unwrap();
        fs::write(src.path().join("HASH/add_kernel.cubin"), vec![7u8; 1000]).unwrap();
        fs::write(outside.path().join("secret"), b"no").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), src.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), src.path().join("dirlink")).unwrap();
        let to = dst.path().join("copy");
        let c = copy(src.path(), &to).unwrap().unwrap();
        assert_eq!((c.files, c.bytes, c.skipped), (2, 1002, 2));
        assert_eq!(
            fs::read(to.join("HASH/add_kernel.cubin")).unwrap().len(),
            1000
        );
        assert!(!to.join("link").exists() && !to.join("dirlink").exists());
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&to.join("HASH")), 0o777);
        assert_eq!(mode(&to.join("HASH/add_kernel.json")), 0o666);
        assert!(fs::read_dir(to.join("HASH")).unwrap().all(|e| {
            !e.unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".partial")
        }));
    }

    #[test]
    fn a_missing_source_copies_nothing() {
        let dst = tempfile::tempdir().unwrap();
        assert_eq!(
            copy(&dst.path().join("absent"), &dst.path().join("to")).unwrap(),
            None
        );
        let file = dst.path().join("file");
        fs::write(&file, b"x").unwrap();
        assert_eq!(copy(&file, &dst.path().join("to")).unwrap(), None);
        assert!(!dst.path().join("to").exists());
        main_with(&dst.path().join("absent"), &dst.path().join("to"));
    }
}
