//! Safe extraction of a cache layer (a gzip tar) into the node's cache root.
//!
//! Everything is written into a fresh staging directory inside the root and renamed into
//! place at the end, so a cache directory either is complete or does not exist. Refused,
//! with nothing left behind: absolute paths, `..`, symbolic links that point outside the
//! cache, hard links to anything outside it, paths through a link, device files, FIFOs,
//! and layers over the size or entry-count limits.

use std::fs::{self, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{OpenOptionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use flate2::read::GzDecoder;
use tar::{Archive, EntryType};

/// Caps on one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Total bytes of file content.
    pub max_bytes: u64,
    /// Number of tar entries.
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: 32 << 30,
            max_entries: 1_000_000,
        }
    }
}

/// What an extraction produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extracted {
    /// Regular files written.
    pub files: u64,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Whether the target already existed (staged before; nothing was written).
    pub already_present: bool,
}

/// Why a layer was refused.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    /// An entry with an absolute path.
    #[error("entry {0:?} has an absolute path")]
    AbsolutePath(String),
    /// An entry whose path climbs out with `..`.
    #[error("entry {0:?} contains '..'")]
    ParentDir(String),
    /// A link whose target is outside the cache.
    #[error("link {path:?} points outside the cache ({target:?})")]
    LinkEscapes {
        /// The link.
        path: String,
        /// Where it points.
        target: String,
    },
    /// An entry placed below a link.
    #[error("entry {0:?} lies below a link")]
    ThroughLink(String),
    /// A device file, FIFO or other special entry.
    #[error("entry {path:?} is a {kind}, not allowed in a cache")]
    SpecialFile {
        /// The entry.
        path: String,
        /// Its type.
        kind: String,
    },
    /// More content than the limit.
    #[error("layer content exceeds {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// More entries than the limit.
    #[error("layer has more than {limit} entries")]
    TooManyEntries {
        /// The limit.
        limit: u64,
    },
    /// The same path twice with different kinds, or a file over a directory.
    #[error("entry {0:?} conflicts with an earlier entry")]
    Conflict(String),
    /// Reading the layer or writing the files failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> ExtractError {
    let context = context.into();
    move |source| ExtractError::Io { context, source }
}

/// Extract the gzip tar `layer` into `target` (created atomically; its parent is created),
/// staging inside `root`. `target` must lie inside `root`.
pub fn extract(
    layer: impl Read,
    root: &Path,
    target: &Path,
    limits: Limits,
) -> Result<Extracted, ExtractError> {
    extract_checked(layer, root, target, limits, |_| Ok::<(), ExtractError>(()))
}

/// [`extract`], running `check` on the staging directory before it is renamed into place:
/// an error from `check` leaves nothing behind, and whatever `check` changes is part of
/// the cache when it appears. So `target` existing always means complete and checked.
pub fn extract_checked<E: From<ExtractError>>(
    layer: impl Read,
    root: &Path,
    target: &Path,
    limits: Limits,
    check: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<Extracted, E> {
    if target.exists() {
        return Ok(Extracted {
            files: 0,
            bytes: 0,
            already_present: true,
        });
    }
    fs::create_dir_all(root).map_err(io_err(format!("creating {}", root.display())))?;
    let staging = tempfile::Builder::new()
        .prefix(".staging-")
        .tempdir_in(root)
        .map_err(io_err("creating a staging directory"))?;
    let stats = unpack(layer, staging.path(), limits)?;
    check(staging.path())?;
    let parent = target.parent().unwrap_or(root);
    fs::create_dir_all(parent).map_err(io_err(format!("creating {}", parent.display())))?;
    let kept = staging.keep();
    if let Err(e) = fs::rename(&kept, target) {
        let _ = fs::remove_dir_all(&kept);
        if target.exists() {
            // Another worker finished the same digest first.
            return Ok(Extracted {
                files: 0,
                bytes: 0,
                already_present: true,
            });
        }
        return Err(io_err(format!("moving the cache into {}", target.display()))(e).into());
    }
    Ok(stats)
}

fn unpack(layer: impl Read, dir: &Path, limits: Limits) -> Result<Extracted, ExtractError> {
    let mut archive = Archive::new(GzDecoder::new(layer));
    let mut stats = Extracted {
        files: 0,
        bytes: 0,
        already_present: false,
    };
    let mut entries_seen = 0u64;
    for entry in archive.entries().map_err(io_err("reading the layer"))? {
        let mut entry = entry.map_err(io_err("reading the layer"))?;
        entries_seen += 1;
        if entries_seen > limits.max_entries {
            return Err(ExtractError::TooManyEntries {
                limit: limits.max_entries,
            });
        }
        let raw = entry
            .path()
            .map_err(io_err("reading an entry path"))?
            .into_owned();
        let shown = raw.display().to_string();
        let rel = relative(&raw, &shown)?;
        if rel.as_os_str().is_empty() {
            continue; // the archive's own "./"
        }
        refuse_links_above(dir, &rel, &shown)?;
        let dest = dir.join(&rel);
        let kind = entry.header().entry_type();
        match kind {
            EntryType::Directory => {
                if dest.symlink_metadata().is_ok_and(|m| !m.is_dir()) {
                    return Err(ExtractError::Conflict(shown));
                }
                fs::create_dir_all(&dest).map_err(io_err(format!("creating {shown}")))?;
            }
            EntryType::Regular | EntryType::Continuous => {
                let declared = entry
                    .header()
                    .size()
                    .map_err(io_err(format!("reading the size of {shown}")))?;
                if stats.bytes.saturating_add(declared) > limits.max_bytes {
                    return Err(ExtractError::TooLarge {
                        limit: limits.max_bytes,
                    });
                }
                make_parent(&dest, &shown)?;
                let mode = if entry.header().mode().unwrap_or(0o644) & 0o111 != 0 {
                    0o755
                } else {
                    0o644
                };
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode)
                    .open(&dest)
                    .map_err(|e| {
                        if e.kind() == io::ErrorKind::AlreadyExists {
                            ExtractError::Conflict(shown.clone())
                        } else {
                            io_err(format!("creating {shown}"))(e)
                        }
                    })?;
                let budget = limits.max_bytes - stats.bytes;
                let written = io::copy(&mut (&mut entry).take(budget + 1), &mut file)
                    .map_err(io_err(format!("writing {shown}")))?;
                if written > budget {
                    return Err(ExtractError::TooLarge {
                        limit: limits.max_bytes,
                    });
                }
                stats.bytes += written;
                stats.files += 1;
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(io_err(format!("reading the target of {shown}")))?
                    .unwrap_or_default()
                    .into_owned();
                if !stays_inside(&rel, &target) {
                    return Err(ExtractError::LinkEscapes {
                        path: shown,
                        target: target.display().to_string(),
                    });
                }
                make_parent(&dest, &shown)?;
                symlink(&target, &dest).map_err(|e| {
                    if e.kind() == io::ErrorKind::AlreadyExists {
                        ExtractError::Conflict(shown.clone())
                    } else {
                        io_err(format!("linking {shown}"))(e)
                    }
                })?;
            }
            EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(io_err(format!("reading the target of {shown}")))?
                    .unwrap_or_default()
                    .into_owned();
                let escape = || ExtractError::LinkEscapes {
                    path: shown.clone(),
                    target: target.display().to_string(),
                };
                let target_rel = relative(&target, &shown).map_err(|_| escape())?;
                refuse_links_above(dir, &target_rel, &shown).map_err(|_| escape())?;
                let source = dir.join(&target_rel);
                if !source.symlink_metadata().is_ok_and(|m| m.is_file()) {
                    return Err(escape());
                }
                make_parent(&dest, &shown)?;
                fs::hard_link(&source, &dest).map_err(io_err(format!("linking {shown}")))?;
                stats.files += 1;
            }
            EntryType::XHeader
            | EntryType::XGlobalHeader
            | EntryType::GNULongName
            | EntryType::GNULongLink => {}
            other => {
                return Err(ExtractError::SpecialFile {
                    path: shown,
                    kind: special_name(other),
                });
            }
        }
    }
    Ok(stats)
}

fn special_name(kind: EntryType) -> String {
    match kind {
        EntryType::Char => "character device".into(),
        EntryType::Block => "block device".into(),
        EntryType::Fifo => "FIFO".into(),
        other => format!("special entry ({other:?})"),
    }
}

/// The path as a clean relative path, or why it is not one.
fn relative(path: &Path, shown: &str) -> Result<PathBuf, ExtractError> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(c) => out.push(c),
            Component::CurDir => {}
            Component::ParentDir => return Err(ExtractError::ParentDir(shown.to_string())),
            Component::RootDir | Component::Prefix(_) => {
                return Err(ExtractError::AbsolutePath(shown.to_string()));
            }
        }
    }
    Ok(out)
}

/// Whether a symlink at `link` (relative to the cache root) pointing to `target` resolves
/// inside the cache.
fn stays_inside(link: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth: Vec<&std::ffi::OsStr> = link
        .parent()
        .into_iter()
        .flat_map(Path::components)
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    for component in target.components() {
        match component {
            Component::Normal(n) => depth.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if depth.pop().is_none() {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Refuse an entry whose parent directories include a link: writing below a link could
/// land anywhere the link points.
fn refuse_links_above(dir: &Path, rel: &Path, shown: &str) -> Result<(), ExtractError> {
    let mut current = dir.to_path_buf();
    if let Some(parent) = rel.parent() {
        for component in parent.components() {
            current.push(component);
            match current.symlink_metadata() {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(ExtractError::ThroughLink(shown.to_string()));
                }
                Ok(m) if !m.is_dir() => return Err(ExtractError::Conflict(shown.to_string())),
                _ => {}
            }
        }
    }
    Ok(())
}

fn make_parent(dest: &Path, shown: &str) -> Result<(), ExtractError> {
    match dest.parent() {
        Some(parent) => {
            fs::create_dir_all(parent).map_err(io_err(format!("creating the directory of {shown}")))
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::Compression;
    use flate2::write::GzEncoder;

    /// A tar entry spelled out, with paths written raw (the tar crate's builder refuses
    /// the malicious ones we need).
    struct Raw<'a> {
        path: &'a str,
        kind: EntryType,
        data: &'a [u8],
        link: Option<&'a str>,
    }

    fn file<'a>(path: &'a str, data: &'a [u8]) -> Raw<'a> {
        Raw {
            path,
            kind: EntryType::Regular,
            data,
            link: None,
        }
    }

    fn layer(entries: &[Raw<'_>]) -> Vec<u8> {
        let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
        for e in entries {
            let mut header = tar::Header::new_gnu();
            let name = &mut header.as_old_mut().name;
            name[..e.path.len()].copy_from_slice(e.path.as_bytes());
            header.set_entry_type(e.kind);
            header.set_size(e.data.len() as u64);
            header.set_mode(0o644);
            if let Some(link) = e.link {
                let l = &mut header.as_old_mut().linkname;
                l[..link.len()].copy_from_slice(link.as_bytes());
            }
            header.set_cksum();
            builder.append(&header, e.data).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap()
    }

    fn run(
        entries: &[Raw<'_>],
        limits: Limits,
    ) -> (tempfile::TempDir, Result<Extracted, ExtractError>) {
        let root = tempfile::tempdir().unwrap();
        let cache_root = root.path().join("cache");
        let result = extract(
            &layer(entries)[..],
            &cache_root,
            &cache_root.join("ns/name/sha256-abc"),
            limits,
        );
        (root, result)
    }

    /// Every file under `dir`, relative.
    fn listing(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
                if e.file_type().unwrap().is_dir() {
                    stack.push(p);
                }
            }
        }
        out.sort();
        out
    }

    fn refused(entries: &[Raw<'_>]) -> ExtractError {
        let (root, result) = run(entries, Limits::default());
        let err = result.unwrap_err();
        // Nothing outside the cache root, and nothing but the (empty) root inside it.
        assert_eq!(listing(root.path()), ["cache"], "after {err}");
        err
    }

    #[test]
    fn extracts_a_triton_cache_atomically() {
        let entries = [
            Raw {
                path: "io.triton.cache/",
                kind: EntryType::Directory,
                data: b"",
                link: None,
            },
            file("io.triton.cache/ABC/add_kernel.json", b"{}"),
            file("io.triton.cache/ABC/add_kernel.hsaco", b"\x7fELF"),
            Raw {
                path: "io.triton.cache/ABC/alias.json",
                kind: EntryType::Symlink,
                data: b"",
                link: Some("add_kernel.json"),
            },
            Raw {
                path: "io.triton.cache/ABC/hard.json",
                kind: EntryType::Link,
                data: b"",
                link: Some("io.triton.cache/ABC/add_kernel.json"),
            },
            file("io.triton.manifest/manifest.json", b"{\"triton\":[]}"),
        ];
        let (root, result) = run(&entries, Limits::default());
        let stats = result.unwrap();
        assert_eq!(
            (stats.files, stats.bytes, stats.already_present),
            (4, 2 + 4 + 13, false)
        );
        let target = root.path().join("cache/ns/name/sha256-abc");
        assert_eq!(
            fs::read_to_string(target.join("io.triton.cache/ABC/alias.json")).unwrap(),
            "{}"
        );
        assert_eq!(
            listing(&root.path().join("cache")),
            [
                "ns",
                "ns/name",
                "ns/name/sha256-abc",
                "ns/name/sha256-abc/io.triton.cache",
                "ns/name/sha256-abc/io.triton.cache/ABC",
                "ns/name/sha256-abc/io.triton.cache/ABC/add_kernel.hsaco",
                "ns/name/sha256-abc/io.triton.cache/ABC/add_kernel.json",
                "ns/name/sha256-abc/io.triton.cache/ABC/alias.json",
                "ns/name/sha256-abc/io.triton.cache/ABC/hard.json",
                "ns/name/sha256-abc/io.triton.manifest",
                "ns/name/sha256-abc/io.triton.manifest/manifest.json",
            ]
        );
        // A second run finds it in place and writes nothing.
        let again = extract(
            &layer(&entries)[..],
            &root.path().join("cache"),
            &target,
            Limits::default(),
        )
        .unwrap();
        assert!(again.already_present);
    }

    #[test]
    fn refuses_dot_dot() {
        assert!(
            matches!(refused(&[file("io.triton.cache/../../evil", b"x")]), ExtractError::ParentDir(p) if p == "io.triton.cache/../../evil")
        );
    }

    #[test]
    fn refuses_absolute_paths() {
        assert!(matches!(
            refused(&[file("/etc/cron.d/evil", b"x")]),
            ExtractError::AbsolutePath(_)
        ));
    }

    #[test]
    fn refuses_escaping_symlinks() {
        let e = refused(&[Raw {
            path: "io.triton.cache/l",
            kind: EntryType::Symlink,
            data: b"",
            link: Some("../../etc"),
        }]);
        assert!(matches!(e, ExtractError::LinkEscapes { .. }), "{e}");
        let e = refused(&[Raw {
            path: "l",
            kind: EntryType::Symlink,
            data: b"",
            link: Some("/etc/passwd"),
        }]);
        assert!(matches!(e, ExtractError::LinkEscapes { .. }), "{e}");
    }

    #[test]
    fn refuses_writing_through_a_link() {
        let e = refused(&[
            Raw {
                path: "dir",
                kind: EntryType::Symlink,
                data: b"",
                link: Some("."),
            },
            file("dir/x", b"x"),
        ]);
        assert!(matches!(e, ExtractError::ThroughLink(p) if p == "dir/x"));
    }

    #[test]
    fn refuses_escaping_hardlinks() {
        let e = refused(&[Raw {
            path: "h",
            kind: EntryType::Link,
            data: b"",
            link: Some("../../../etc/shadow"),
        }]);
        assert!(matches!(e, ExtractError::LinkEscapes { .. }), "{e}");
        let e = refused(&[Raw {
            path: "h",
            kind: EntryType::Link,
            data: b"",
            link: Some("/etc/shadow"),
        }]);
        assert!(matches!(e, ExtractError::LinkEscapes { .. }), "{e}");
        let e = refused(&[Raw {
            path: "h",
            kind: EntryType::Link,
            data: b"",
            link: Some("not-there"),
        }]);
        assert!(matches!(e, ExtractError::LinkEscapes { .. }), "{e}");
    }

    #[test]
    fn refuses_device_files_and_fifos() {
        for (kind, name) in [
            (EntryType::Char, "character device"),
            (EntryType::Block, "block device"),
            (EntryType::Fifo, "FIFO"),
        ] {
            let e = refused(&[Raw {
                path: "dev",
                kind,
                data: b"",
                link: None,
            }]);
            assert!(
                matches!(&e, ExtractError::SpecialFile { kind, .. } if kind == name),
                "{e}"
            );
        }
    }

    #[test]
    fn refuses_oversized_layers_and_too_many_entries() {
        let (root, r) = run(
            &[file("a", &[0u8; 600]), file("b", &[0u8; 600])],
            Limits {
                max_bytes: 1000,
                max_entries: 10,
            },
        );
        assert!(matches!(
            r.unwrap_err(),
            ExtractError::TooLarge { limit: 1000 }
        ));
        assert_eq!(listing(root.path()), ["cache"]);
        let (root, r) = run(
            &[file("a", b"1"), file("b", b"2"), file("c", b"3")],
            Limits {
                max_bytes: 1000,
                max_entries: 2,
            },
        );
        assert!(matches!(
            r.unwrap_err(),
            ExtractError::TooManyEntries { limit: 2 }
        ));
        assert_eq!(listing(root.path()), ["cache"]);
    }

    #[test]
    fn refuses_a_file_replacing_a_link() {
        let e = refused(&[
            Raw {
                path: "x",
                kind: EntryType::Symlink,
                data: b"",
                link: Some("y"),
            },
            file("x", b"over"),
        ]);
        assert!(matches!(e, ExtractError::Conflict(_)), "{e}");
    }

    #[test]
    fn a_corrupt_layer_is_an_error_not_a_panic() {
        let root = tempfile::tempdir().unwrap();
        let e = extract(
            &b"not gzip at all"[..],
            root.path(),
            &root.path().join("t"),
            Limits::default(),
        )
        .unwrap_err();
        assert!(matches!(e, ExtractError::Io { .. }), "{e}");
        assert!(!root.path().join("t").exists());
    }
}
