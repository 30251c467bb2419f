//! Reading and replacing files of a staged cache without ever following a link.
//!
//! A cache directory comes from a registry: whatever it holds is treated as hostile. Files
//! are opened with `O_NOFOLLOW` (a symbolic link is an error, never followed), must be
//! regular files (a FIFO or device would block or never end), and are read up to a cap.
//! Files are replaced by writing a temporary file beside them and renaming it over the old
//! one, so a reader (or a process killed half way) sees the old file or the new one,
//! never half of one; a hard link shared with another cache is replaced, not written
//! through.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Temporary files of [`replace`] start with this; [`remove_leftovers`] deletes them.
pub const TEMP_PREFIX: &str = ".kc-replace-";

/// Open `path` for reading: never through a symbolic link at its last component, and
/// only a regular file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::other(format!("{} is a symbolic link", path.display()))
            } else {
                e
            }
        })?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok(file)
}

/// Read the regular file `path` (see [`open_regular`]), at most `max` bytes.
pub fn read_bounded(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let mut out = Vec::new();
    file.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(io::Error::other(format!(
            "{} is larger than {max} bytes",
            path.display()
        )));
    }
    Ok(out)
}

/// Replace `path` with `content`: written to a temporary file in the same directory,
/// flushed, then renamed over `path`, keeping `mode`.
pub fn replace(path: &Path, content: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp: PathBuf = dir.join(format!("{TEMP_PREFIX}{name}"));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(mode)
            .open(&temp)?;
        file.write_all(content)?;
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Delete the temporary files an interrupted [`replace`] left in `dir`.
pub fn remove_leftovers(dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for entry in fs::read_dir(dir)?.flatten() {
        if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX)
            && entry.file_type().is_ok_and(|t| t.is_file())
        {
            fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, symlink};

    #[test]
    fn links_fifos_and_oversized_files_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret"), b"secret").unwrap();
        symlink(outside.path().join("secret"), dir.path().join("link")).unwrap();
        let e = read_bounded(&dir.path().join("link"), 100).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        symlink("/dev/zero", dir.path().join("zero")).unwrap();
        assert!(read_bounded(&dir.path().join("zero"), 100).is_err());
        let e = read_bounded(Path::new("/dev/zero"), 100).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        fs::write(dir.path().join("big"), vec![0u8; 101]).unwrap();
        let e = read_bounded(&dir.path().join("big"), 100).unwrap_err();
        assert!(e.to_string().contains("larger than 100 bytes"), "{e}");
        assert_eq!(
            read_bounded(&dir.path().join("big"), 101).unwrap().len(),
            101
        );
    }

    #[test]
    fn replace_breaks_hard_links_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        let b = dir.path().join("b.json");
        fs::write(&a, b"old").unwrap();
        fs::hard_link(&a, &b).unwrap();
        replace(&a, b"new", 0o644).unwrap();
        assert_eq!(fs::read(&a).unwrap(), b"new");
        assert_eq!(
            fs::read(&b).unwrap(),
            b"old",
            "the other link keeps its content"
        );
        assert_eq!(fs::metadata(&a).unwrap().mode() & 0o777, 0o644);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
        fs::write(dir.path().join(format!("{TEMP_PREFIX}a.json")), b"half").unwrap();
        assert_eq!(remove_leftovers(dir.path()).unwrap(), 1);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
