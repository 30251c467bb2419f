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
use std::io::{self, BufRead, Read, Write as _};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use flate2::bufread::GzDecoder;
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
    /// A compressed stream that cannot be read (malformed, or a zstd frame asking for a
    /// window over [`ZSTD_MAX_WINDOW`]).
    #[error("the layer's compressed stream: {0}")]
    Compressed(String),
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

/// A change to the content of some regular files as they are extracted (Triton group
/// files pointed at the path pods see: [`crate::triton::GroupFiles`]), so that they are
/// written once, already right, rather than rewritten after extraction.
pub trait Rewrite {
    /// Whether the regular file at `path` (clean, relative to the layer's root) is to be
    /// rewritten.
    fn wants(&self, path: &Path) -> bool;
    /// The largest file [`Rewrite::rewrite`] is given (it is read whole into memory): a
    /// wanted file larger than this is an error.
    fn max_bytes(&self) -> u64;
    /// What to write instead of `content`, the content of the file at `path`.
    fn rewrite(&self, path: &Path, content: Vec<u8>) -> io::Result<Vec<u8>>;
}

/// Extract the gzip tar `layer` into `target` (created atomically; its parent is created),
/// staging inside `root`. `target` must lie inside `root`. `layer` is read to its end
/// (past the tar's end-of-archive blocks and gzip's trailer) before the directory is
/// renamed into place: a reader that checks its content at its end (a digest, as
/// [`crate::registry::BlobReader`] does) fails the extraction if that check fails.
pub fn extract(
    layer: impl BufRead,
    root: &Path,
    target: &Path,
    limits: Limits,
) -> Result<Extracted, ExtractError> {
    extract_checked(layer, root, target, limits, None, |_| {
        Ok::<(), ExtractError>(())
    })
}

/// [`extract`], with the files `rewrite` wants rewritten as they are written, running
/// `check` on the staging directory before it is renamed into place: an error from
/// `check` leaves nothing behind, and whatever `check` changes is part of the cache when
/// it appears. So `target` existing always means complete and checked. The byte counts
/// (and the limit) are of the layer's content, before any rewrite.
pub fn extract_checked<E: From<ExtractError>>(
    layer: impl BufRead,
    root: &Path,
    target: &Path,
    limits: Limits,
    rewrite: Option<&dyn Rewrite>,
    check: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<Extracted, E> {
    stage_dir(
        root,
        target,
        |staging| unpack(layer, Compression::Gzip, staging, limits, rewrite),
        check,
    )
}

/// How a tar layer is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// A gzip tar.
    Gzip,
    /// A zstd tar (one or more frames; a frame's window at most
    /// [`ZSTD_MAX_WINDOW`], as libzstd's default).
    Zstd,
}

/// The largest zstd window a layer may ask for (128 MiB, libzstd's default limit,
/// `ZSTD_WINDOWLOG_LIMIT_DEFAULT`): a frame declaring more is refused before anything is
/// allocated for it.
pub const ZSTD_MAX_WINDOW: u64 = 128 << 20;

/// The decompressed bytes of a zstd stream of one or more frames (pzstd and `zstd -T`
/// write several), each checked against [`ZSTD_MAX_WINDOW`].
struct ZstdFrames<R: Read> {
    decoder: Option<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>>,
}

impl<R: BufRead> ZstdFrames<R> {
    fn new(source: R) -> Result<Self, ExtractError> {
        let decoder =
            ruzstd::decoding::StreamingDecoder::new_with_max_window_size(source, ZSTD_MAX_WINDOW)
                .map_err(|e| ExtractError::Compressed(e.to_string()))?;
        Ok(Self {
            decoder: Some(decoder),
        })
    }
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(decoder) = self.decoder.as_mut() else {
                return Ok(0);
            };
            let n = decoder.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // This frame is done: another follows unless the stream ends here.
            if decoder.get_mut().fill_buf()?.is_empty() {
                return Ok(0);
            }
            let Some(done) = self.decoder.take() else {
                return Ok(0);
            };
            let (source, mut frame) = done.into_parts();
            frame.set_max_window_size(ZSTD_MAX_WINDOW);
            self.decoder = Some(
                ruzstd::decoding::StreamingDecoder::new_with_decoder(source, frame)
                    .map_err(io::Error::other)?,
            );
        }
    }
}

/// Extract the tar `layer` (compressed as `compression`) into `dir`, an empty directory
/// the caller made (and removes on an error), with the same refusals and limits as
/// [`extract`]; `layer` is read to its end, so a reader that checks a digest at its end
/// fails the extraction when the check fails. For artifacts whose files are moved
/// elsewhere after extraction (OCI model artifacts into the Hugging Face layout).
pub fn unpack_into(
    layer: impl BufRead,
    compression: Compression,
    dir: &Path,
    limits: Limits,
) -> Result<Extracted, ExtractError> {
    unpack(layer, compression, dir, limits, None)
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

fn unpack(
    mut layer: impl BufRead,
    compression: Compression,
    dir: &Path,
    limits: Limits,
    rewrite: Option<&dyn Rewrite>,
) -> Result<Extracted, ExtractError> {
    let stats = match compression {
        Compression::Gzip => unpack_entries(GzDecoder::new(&mut layer), dir, limits, rewrite)?,
        Compression::None => unpack_entries(&mut layer, dir, limits, rewrite)?,
        Compression::Zstd => {
            unpack_entries(ZstdFrames::new(&mut layer)?, dir, limits, rewrite).map_err(
                |e| match e {
                    // The decoder's refusals (a window too large, a malformed frame) are
                    // the layer's, not the disk's.
                    ExtractError::Io { source, .. }
                        if source.kind() == io::ErrorKind::Other
                            && source.get_ref().is_some_and(|i| {
                                i.is::<ruzstd::decoding::errors::FrameDecoderError>()
                            }) =>
                    {
                        ExtractError::Compressed(source.to_string())
                    }
                    other => other,
                },
            )?
        }
    };
    // The rest (end-of-archive blocks, padding, gzip's trailer), so that the layer's
    // reader sees its end before the cache can appear.
    loop {
        let rest = layer.fill_buf().map_err(io_err("reading the layer"))?.len();
        if rest == 0 {
            return Ok(stats);
        }
        layer.consume(rest);
    }
}

fn unpack_entries(
    tar: impl Read,
    dir: &Path,
    limits: Limits,
    rewrite: Option<&dyn Rewrite>,
) -> Result<Extracted, ExtractError> {
    let mut archive = Archive::new(tar);
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
            EntryKind::File => {
                let rewrite = rewrite.filter(|r| r.wants(&rel));
                let file = NewFile {
                    dest: &dest,
                    rel: &rel,
                    shown: &shown,
                };
                write_file(&mut entry, &file, limits, rewrite, &mut stats)?;
            }
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

/// Where a regular file entry goes: `dest` in the staging directory, `rel` in the layer,
/// `shown` in messages.
struct NewFile<'a> {
    dest: &'a Path,
    rel: &'a Path,
    shown: &'a str,
}

/// A regular file entry: written to a new file at `dest` (never over anything), its bytes
/// counted against `limits.max_bytes` as declared and again as read; through `rewrite`
/// when given (the whole file in memory, at most [`Rewrite::max_bytes`]).
fn write_file<R: Read>(
    entry: &mut Entry<'_, R>,
    file: &NewFile<'_>,
    limits: Limits,
    rewrite: Option<&dyn Rewrite>,
    stats: &mut Extracted,
) -> Result<(), ExtractError> {
    let NewFile { dest, rel, shown } = *file;
    let declared = entry
        .header()
        .size()
        .map_err(io_err(format!("reading the size of {shown}")))?;
    if stats.bytes.saturating_add(declared) > limits.max_bytes {
        return Err(ExtractError::TooLarge {
            limit: limits.max_bytes,
        });
    }
    let too_large_to_rewrite = |max: u64| ExtractError::Io {
        context: format!("rewriting {shown}"),
        source: io::Error::other(format!("larger than the {max} bytes accepted")),
    };
    if let Some(r) = rewrite
        && declared > r.max_bytes()
    {
        return Err(too_large_to_rewrite(r.max_bytes()));
    }
    make_parent(dest, shown)?;
    let mode = if entry.header().mode().unwrap_or(0o644) & 0o111 != 0 {
        0o755
    } else {
        0o644
    };
    let mut out = OpenOptions::new()
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
    let written = if let Some(r) = rewrite {
        let mut content = Vec::new();
        entry
            .by_ref()
            .take(budget.min(r.max_bytes()) + 1)
            .read_to_end(&mut content)
            .map_err(io_err(format!("reading {shown}")))?;
        let read = content.len() as u64;
        if read > budget {
            return Err(ExtractError::TooLarge {
                limit: limits.max_bytes,
            });
        }
        if read > r.max_bytes() {
            return Err(too_large_to_rewrite(r.max_bytes()));
        }
        let content = r
            .rewrite(rel, content)
            .map_err(io_err(format!("rewriting {shown}")))?;
        out.write_all(&content)
            .map_err(io_err(format!("writing {shown}")))?;
        read
    } else {
        io::copy(&mut entry.by_ref().take(budget + 1), &mut out)
            .map_err(io_err(format!("writing {shown}")))?
    };
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

/// The property target for extraction: arbitrary tar entries (path, type, link target,
/// size, mode). Whatever the layer holds, after `extract` every path written resolves
/// inside the target, nothing outside the cache root changes, no file has a setuid,
/// setgid or sticky bit, and after an error the target does not exist and the root is
/// empty. Cases: `PROPTEST_CASES` (proptest's own variable; `scripts/test.sh` sets a
/// bounded number, e.g. `PROPTEST_CASES=100000 cargo test -p
/// kubeairunway-kernelcache-artifact --lib extract::` runs longer).
#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;
