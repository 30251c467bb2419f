//! Safe extraction of a cache layer (a gzip tar) into the node's cache root.
//!
//! Everything is written into a fresh staging directory inside the root and renamed into
//! place at the end, so a cache directory either is complete or does not exist. Refused,
//! with nothing left behind: absolute paths, `..`, symbolic links, hard links to anything
//! but a regular file extracted before, device files, FIFOs, and layers over the size or
//! entry-count limits.
//!
//! Symbolic links are refused outright rather than resolved: no Triton or vLLM cache
//! holds one (the GKM/MCV example image `quay.io/gkm/vector-add-cache:rocm` and the MCV
//! example cache trees in `tests/data` have none), and a chain of links that each look
//! harmless can resolve outside the cache. Files are written with mode 0644 or 0755
//! only: no setuid, setgid or sticky bit survives.

use std::fs::{self, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use flate2::read::GzDecoder;
use tar::{Archive, Entry, EntryType};

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
    /// A symbolic link (never allowed in a cache).
    #[error(
        "entry {path:?} is a symbolic link (to {target:?}): kernel cache layers may not hold symbolic links"
    )]
    Link {
        /// The link.
        path: String,
        /// Where it points.
        target: String,
    },
    /// A hard link to anything but a regular file extracted before it.
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
    stage_dir(
        root,
        target,
        |staging| unpack(layer, staging, limits),
        check,
    )
}

/// Stage `target` as a copy of the complete cache directory `source` (another cache of
/// the same digest): directories are created, files are hard links (no disk space used,
/// never written through: Triton group files are rewritten by write-then-rename), then
/// `check` runs and the directory is renamed into place, as [`extract_checked`] does.
/// Anything but directories and regular files in `source` is an error.
pub fn link_checked<E: From<ExtractError>>(
    source: &Path,
    root: &Path,
    target: &Path,
    check: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<Extracted, E> {
    stage_dir(root, target, |staging| link_tree(source, staging), check)
}

/// A staging directory in `root`, filled by `fill`, checked by `check`, renamed into
/// `target`: `target` exists only complete and checked; on any error nothing is left.
fn stage_dir<E: From<ExtractError>>(
    root: &Path,
    target: &Path,
    fill: impl FnOnce(&Path) -> Result<Extracted, ExtractError>,
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
    let stats = fill(staging.path())?;
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

/// Hard-link the tree at `source` into the empty directory `dir`.
fn link_tree(source: &Path, dir: &Path) -> Result<Extracted, ExtractError> {
    let mut stats = Extracted {
        files: 0,
        bytes: 0,
        already_present: false,
    };
    let mut stack = vec![(source.to_path_buf(), dir.to_path_buf())];
    while let Some((from, to)) = stack.pop() {
        for entry in fs::read_dir(&from).map_err(io_err(format!("reading {}", from.display())))? {
            let entry = entry.map_err(io_err(format!("reading {}", from.display())))?;
            let kind = entry
                .file_type()
                .map_err(io_err(format!("reading {}", entry.path().display())))?;
            let dest = to.join(entry.file_name());
            let shown = entry.path().display().to_string();
            if kind.is_dir() {
                fs::create_dir(&dest).map_err(io_err(format!("creating {shown}")))?;
                stack.push((entry.path(), dest));
            } else if kind.is_file() {
                fs::hard_link(entry.path(), &dest).map_err(io_err(format!("linking {shown}")))?;
                stats.files += 1;
            } else {
                return Err(ExtractError::SpecialFile {
                    path: shown,
                    kind: "link or special file in a staged cache".into(),
                });
            }
        }
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
        match entry_kind(entry.header().entry_type()) {
            EntryKind::Directory => make_dir(&dest, &shown)?,
            EntryKind::File => write_file(&mut entry, &dest, &shown, limits, &mut stats)?,
            EntryKind::Symlink => {
                return Err(ExtractError::Link {
                    target: link_target(&entry, &shown)?.display().to_string(),
                    path: shown,
                });
            }
            EntryKind::HardLink => {
                let target = link_target(&entry, &shown)?;
                hard_link(dir, &target, &dest, &shown)?;
                stats.files += 1;
            }
            EntryKind::Metadata => {}
            EntryKind::Special(kind) => {
                return Err(ExtractError::SpecialFile { path: shown, kind });
            }
        }
    }
    Ok(stats)
}

/// What a tar entry becomes in a staged cache.
#[derive(Clone, Debug, PartialEq, Eq)]
enum EntryKind {
    /// A directory, created.
    Directory,
    /// A regular file, written within the size limit.
    File,
    /// A symbolic link: refused (no Triton or vLLM cache has one).
    Symlink,
    /// A hard link to a file extracted before it, inside the cache.
    HardLink,
    /// An extended or long-name header: the tar reader applies it to the next entry.
    Metadata,
    /// A device, FIFO or anything else: refused, named.
    Special(String),
}

/// What the tar entry type `kind` becomes (the one place deciding which entries a cache
/// may hold).
fn entry_kind(kind: EntryType) -> EntryKind {
    match kind {
        EntryType::Directory => EntryKind::Directory,
        EntryType::Regular | EntryType::Continuous => EntryKind::File,
        EntryType::Symlink => EntryKind::Symlink,
        EntryType::Link => EntryKind::HardLink,
        EntryType::XHeader
        | EntryType::XGlobalHeader
        | EntryType::GNULongName
        | EntryType::GNULongLink => EntryKind::Metadata,
        EntryType::Char => EntryKind::Special("character device".into()),
        EntryType::Block => EntryKind::Special("block device".into()),
        EntryType::Fifo => EntryKind::Special("FIFO".into()),
        other => EntryKind::Special(format!("special entry ({other:?})")),
    }
}

/// A directory entry: created, unless something else is in its place.
fn make_dir(dest: &Path, shown: &str) -> Result<(), ExtractError> {
    if dest.symlink_metadata().is_ok_and(|m| !m.is_dir()) {
        return Err(ExtractError::Conflict(shown.to_string()));
    }
    fs::create_dir_all(dest).map_err(io_err(format!("creating {shown}")))
}

/// A regular file entry: written to a new file at `dest` (never over anything), its bytes
/// counted against `limits.max_bytes` as declared and again as read.
fn write_file<R: Read>(
    entry: &mut Entry<'_, R>,
    dest: &Path,
    shown: &str,
    limits: Limits,
    stats: &mut Extracted,
) -> Result<(), ExtractError> {
    let declared = entry
        .header()
        .size()
        .map_err(io_err(format!("reading the size of {shown}")))?;
    if stats.bytes.saturating_add(declared) > limits.max_bytes {
        return Err(ExtractError::TooLarge {
            limit: limits.max_bytes,
        });
    }
    make_parent(dest, shown)?;
    let mode = if entry.header().mode().unwrap_or(0o644) & 0o111 != 0 {
        0o755
    } else {
        0o644
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(dest)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                ExtractError::Conflict(shown.to_string())
            } else {
                io_err(format!("creating {shown}"))(e)
            }
        })?;
    let budget = limits.max_bytes - stats.bytes;
    let written = io::copy(&mut entry.by_ref().take(budget + 1), &mut file)
        .map_err(io_err(format!("writing {shown}")))?;
    if written > budget {
        return Err(ExtractError::TooLarge {
            limit: limits.max_bytes,
        });
    }
    stats.bytes += written;
    stats.files += 1;
    Ok(())
}

/// The target a link entry names.
fn link_target<R: Read>(entry: &Entry<'_, R>, shown: &str) -> Result<PathBuf, ExtractError> {
    Ok(entry
        .link_name()
        .map_err(io_err(format!("reading the target of {shown}")))?
        .unwrap_or_default()
        .into_owned())
}

/// A hard-link entry: `dest` becomes a link to `target`, a regular file extracted before
/// it inside `dir`; anything else (outside, missing, not a file) is refused.
fn hard_link(dir: &Path, target: &Path, dest: &Path, shown: &str) -> Result<(), ExtractError> {
    let escape = || ExtractError::LinkEscapes {
        path: shown.to_string(),
        target: target.display().to_string(),
    };
    let target_rel = relative(target, shown).map_err(|_| escape())?;
    refuse_links_above(dir, &target_rel, shown).map_err(|_| escape())?;
    let source = dir.join(&target_rel);
    if !source.symlink_metadata().is_ok_and(|m| m.is_file()) {
        return Err(escape());
    }
    make_parent(dest, shown)?;
    fs::hard_link(&source, dest).map_err(io_err(format!("linking {shown}")))
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

    #[test]
    fn entry_kinds_only_directories_files_and_inner_hard_links_are_extracted() {
        assert_eq!(entry_kind(EntryType::Directory), EntryKind::Directory);
        assert_eq!(entry_kind(EntryType::Regular), EntryKind::File);
        assert_eq!(entry_kind(EntryType::Continuous), EntryKind::File);
        assert_eq!(entry_kind(EntryType::Symlink), EntryKind::Symlink);
        assert_eq!(entry_kind(EntryType::Link), EntryKind::HardLink);
        for header in [
            EntryType::XHeader,
            EntryType::XGlobalHeader,
            EntryType::GNULongName,
            EntryType::GNULongLink,
        ] {
            assert_eq!(entry_kind(header), EntryKind::Metadata);
        }
        assert_eq!(
            entry_kind(EntryType::Char),
            EntryKind::Special("character device".into())
        );
        assert_eq!(
            entry_kind(EntryType::Block),
            EntryKind::Special("block device".into())
        );
        assert_eq!(
            entry_kind(EntryType::Fifo),
            EntryKind::Special("FIFO".into())
        );
        assert!(matches!(
            entry_kind(EntryType::GNUSparse),
            EntryKind::Special(k) if k.starts_with("special entry")
        ));
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
            fs::read_to_string(target.join("io.triton.cache/ABC/hard.json")).unwrap(),
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
    fn refuses_every_symlink() {
        for target in ["../../etc", "/etc/passwd", "add_kernel.json", "."] {
            let e = refused(&[
                file("io.triton.cache/add_kernel.json", b"{}"),
                Raw {
                    path: "io.triton.cache/l",
                    kind: EntryType::Symlink,
                    data: b"",
                    link: Some(target),
                },
            ]);
            assert!(matches!(e, ExtractError::Link { .. }), "{e}");
        }
    }

    /// The chain from the review: each link is harmless as text, together they resolve
    /// outside the cache (`up` is the cache root, five more `..` climb out of it).
    fn escaping_chain() -> Vec<Raw<'static>> {
        vec![
            Raw {
                path: "d1/d2/d3/d4/d5/d6/d7/d8/up",
                kind: EntryType::Symlink,
                data: b"",
                link: Some("../../../../../../../.."),
            },
            Raw {
                path: "io.triton.manifest/manifest.json",
                kind: EntryType::Symlink,
                data: b"",
                link: Some("../d1/d2/d3/d4/d5/d6/d7/d8/up/../../../../../etc/secret"),
            },
        ]
    }

    #[test]
    fn refuses_a_chain_of_links_that_resolves_outside() {
        let e = refused(&escaping_chain());
        assert!(matches!(e, ExtractError::Link { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "entry \"d1/d2/d3/d4/d5/d6/d7/d8/up\" is a symbolic link (to \"../../../../../../../..\"): kernel cache layers may not hold symbolic links"
        );
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
    fn refuses_a_file_replacing_a_file_or_a_directory() {
        let e = refused(&[file("x", b"one"), file("x", b"over")]);
        assert!(matches!(e, ExtractError::Conflict(_)), "{e}");
        let e = refused(&[file("x/y", b"one"), file("x", b"over")]);
        assert!(matches!(e, ExtractError::Conflict(_)), "{e}");
    }

    #[test]
    fn a_second_cache_of_a_digest_is_hard_links_of_the_first() {
        use std::os::unix::fs::MetadataExt as _;
        let entries = [
            file("io.triton.cache/H/k.json", b"{}"),
            file("io.triton.manifest/manifest.json", b"{\"triton\":[]}"),
        ];
        let (root, result) = run(&entries, Limits::default());
        result.unwrap();
        let cache = root.path().join("cache");
        let first = cache.join("ns/name/sha256-abc");
        let second = cache.join("other/name/sha256-abc");
        let stats = link_checked(&first, &cache, &second, |dir| {
            // What a check changes by write-then-rename stays in the new copy only.
            crate::files::replace(&dir.join("io.triton.cache/H/k.json"), b"[]", 0o644).map_err(
                |e| ExtractError::Io {
                    context: "rewrite".into(),
                    source: e,
                },
            )
        })
        .unwrap();
        assert_eq!((stats.files, stats.already_present), (2, false));
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        assert_eq!(
            ino(&first.join("io.triton.manifest/manifest.json")),
            ino(&second.join("io.triton.manifest/manifest.json"))
        );
        assert_eq!(
            fs::read(first.join("io.triton.cache/H/k.json")).unwrap(),
            b"{}"
        );
        assert_eq!(
            fs::read(second.join("io.triton.cache/H/k.json")).unwrap(),
            b"[]"
        );
        // A failed check leaves nothing.
        let third = cache.join("third/name/sha256-abc");
        let failed = link_checked(&first, &cache, &third, |_| {
            Err(ExtractError::Conflict("check".into()))
        });
        assert!(failed.is_err());
        assert!(!third.exists());
        assert!(!fs::read_dir(&cache).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".staging-")
        }));
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

/// The property target for extraction: arbitrary tar entries (path, type, link target,
/// size, mode). Whatever the layer holds, after `extract` every path written resolves
/// inside the target, nothing outside the cache root changes, no file has a setuid,
/// setgid or sticky bit, and after an error the target does not exist and the root is
/// empty. Cases: `PROPTEST_CASES` (proptest's own variable; `scripts/test.sh` sets a
/// bounded number, e.g. `PROPTEST_CASES=100000 cargo test -p kubeairunway-kernelcache
/// --lib extract::` runs longer).
#[cfg(test)]
mod properties {
    use super::*;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use proptest::prelude::*;
    use std::os::unix::fs::PermissionsExt;

    #[derive(Clone, Debug)]
    struct Arb {
        path: String,
        kind: EntryType,
        data: Vec<u8>,
        link: Option<String>,
        mode: u32,
    }

    fn layer(entries: &[Arb]) -> Vec<u8> {
        let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
        for e in entries {
            let mut header = tar::Header::new_gnu();
            let name = &mut header.as_old_mut().name;
            let n = e.path.len().min(99);
            name[..n].copy_from_slice(&e.path.as_bytes()[..n]);
            header.set_entry_type(e.kind);
            let data: &[u8] = if matches!(e.kind, EntryType::Regular | EntryType::Continuous) {
                &e.data
            } else {
                &[]
            };
            header.set_size(data.len() as u64);
            header.set_mode(e.mode);
            if let Some(link) = &e.link {
                let l = &mut header.as_old_mut().linkname;
                let n = link.len().min(99);
                l[..n].copy_from_slice(&link.as_bytes()[..n]);
            }
            header.set_cksum();
            builder.append(&header, data).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap()
    }

    /// Every path below `dir` (not following links) with its metadata.
    fn tree(dir: &Path) -> Vec<(PathBuf, fs::Metadata)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                let meta = e.path().symlink_metadata().unwrap();
                if meta.is_dir() {
                    stack.push(e.path());
                }
                out.push((e.path(), meta));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        tree(dir)
            .into_iter()
            .map(|(p, m)| {
                let content = if m.is_file() {
                    fs::read(&p).unwrap()
                } else {
                    Vec::new()
                };
                (p, content)
            })
            .collect()
    }

    /// Extract `entries` into a sandbox and check the properties; the result for the
    /// caller's own assertions.
    fn check(entries: &[Arb]) -> Result<Extracted, ExtractError> {
        let sandbox = tempfile::tempdir().unwrap();
        let outside = sandbox.path().join("outside");
        fs::create_dir_all(outside.join("etc")).unwrap();
        fs::write(outside.join("etc/secret"), b"secret").unwrap();
        let before = snapshot(&outside);
        let root = sandbox.path().join("outside/cache-parent/cache");
        let target = root.join("ns/name/sha256-abc");
        let result = extract(
            &layer(entries)[..],
            &root,
            &target,
            Limits {
                max_bytes: 256,
                max_entries: 12,
            },
        );
        let after: Vec<_> = snapshot(&outside)
            .into_iter()
            .filter(|(p, _)| !p.starts_with(&root))
            .collect();
        let before: Vec<_> = before
            .into_iter()
            .chain([
                (outside.join("cache-parent"), Vec::new()),
                (root.clone(), Vec::new()),
            ])
            .filter(|(p, _)| !p.starts_with(&root))
            .collect();
        let mut before_sorted = before;
        before_sorted.sort();
        assert_eq!(
            after, before_sorted,
            "nothing outside the cache root changes"
        );
        if result.is_ok() {
            let real_target = fs::canonicalize(&target).unwrap();
            for (path, meta) in tree(&target) {
                assert!(
                    meta.is_file() || meta.is_dir(),
                    "{} is neither a file nor a directory",
                    path.display()
                );
                assert_eq!(
                    meta.permissions().mode() & 0o7000,
                    0,
                    "{} has a special mode bit",
                    path.display()
                );
                let real = fs::canonicalize(&path).unwrap();
                assert!(real.starts_with(&real_target), "{} escapes", path.display());
            }
            for (path, _) in tree(&root) {
                assert!(
                    path.starts_with(&target) || target.starts_with(&path),
                    "{} besides the target",
                    path.display()
                );
            }
        } else {
            assert!(!target.exists(), "no target after an error");
            assert!(tree(&root).is_empty(), "root left empty after an error");
        }
        result
    }

    #[test]
    fn the_escaping_chain_and_its_variants_keep_the_properties() {
        let link = |path: &str, to: &str| Arb {
            path: path.into(),
            kind: EntryType::Symlink,
            data: Vec::new(),
            link: Some(to.into()),
            mode: 0o777,
        };
        let chain = [
            link("d1/d2/d3/d4/d5/d6/d7/d8/up", "../../../../../../../.."),
            link(
                "io.triton.manifest/manifest.json",
                "../d1/d2/d3/d4/d5/d6/d7/d8/up/../../../../../etc/secret",
            ),
        ];
        assert!(check(&chain).is_err());
        let hard = Arb {
            path: "io.triton.manifest/manifest.json".into(),
            kind: EntryType::Link,
            data: Vec::new(),
            link: Some("d1/d2/d3/d4/d5/d6/d7/d8/up/../../../../../etc/secret".into()),
            mode: 0o644,
        };
        assert!(check(&[chain[0].clone(), hard]).is_err());
        let setuid = Arb {
            path: "io.triton.cache/x".into(),
            kind: EntryType::Regular,
            data: b"#!/bin/sh".to_vec(),
            link: None,
            mode: 0o6755,
        };
        assert!(check(&[setuid]).is_ok());
    }

    fn component() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("a".to_string()),
            Just("b".to_string()),
            Just("io.triton.cache".to_string()),
            Just("..".to_string()),
            Just(".".to_string()),
            Just(String::new()),
            Just("etc".to_string()),
            Just("up".to_string()),
            Just("outside".to_string()),
        ]
    }

    fn path() -> impl Strategy<Value = String> {
        (any::<bool>(), proptest::collection::vec(component(), 1..6)).prop_map(|(abs, c)| {
            let joined = c.join("/");
            if abs { format!("/{joined}") } else { joined }
        })
    }

    fn kind() -> impl Strategy<Value = EntryType> {
        prop_oneof![
            4 => Just(EntryType::Regular),
            3 => Just(EntryType::Directory),
            2 => Just(EntryType::Symlink),
            2 => Just(EntryType::Link),
            1 => Just(EntryType::Char),
            1 => Just(EntryType::Block),
            1 => Just(EntryType::Fifo),
            1 => Just(EntryType::GNUSparse),
        ]
    }

    fn entry() -> impl Strategy<Value = Arb> {
        (
            path(),
            kind(),
            proptest::collection::vec(any::<u8>(), 0..80),
            proptest::option::of(path()),
            0u32..0o10000,
        )
            .prop_map(|(path, kind, data, link, mode)| Arb {
                path,
                kind,
                data,
                link,
                mode,
            })
    }

    proptest! {
        #[test]
        fn arbitrary_layers_never_write_outside_the_target(
            entries in proptest::collection::vec(entry(), 0..14)
        ) {
            let _ = check(&entries);
        }
    }
}
