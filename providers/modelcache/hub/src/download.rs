//! One file into `blobs/<etag>`: streamed to `blobs/<etag>.incomplete` (memory bounded by
//! one network chunk and one write buffer), resumed from that file's length with
//! `Range: bytes=<n>-` after an interruption or a restart, and renamed to `blobs/<etag>`
//! only once its size and digest match the listing. As in hfpy `file_download.py`
//! `http_get`: a `200` answer to a `Range` request restarts from 0, and a failed attempt
//! is retried (5 times by default). Unlike it, the content's digest is checked (it checks
//! only the size): on a mismatch the partial file is deleted.

use std::io::{Read as _, Seek as _};
use std::path::Path;
use std::time::Duration;

use reqwest_oci as reqwest;
use tokio::io::{AsyncSeekExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

use crate::Error;
use crate::client::{Hub, HubFile, transport};
use crate::hash::Hasher;
use crate::layout::{RepoId, RepoLayout, check_etag, check_file_path};

/// Bytes buffered before a write to disk.
const WRITE_BUFFER: usize = 1 << 20;

/// What fetching one blob did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fetched {
    /// Bytes received from the hub, over all attempts.
    pub received: u64,
    /// The blob was already in the cache.
    pub cached: bool,
    /// Attempts that resumed a partial file with `Range`.
    pub resumed: u32,
}

/// Where an attempt starts: the partial file's length and the hash of its bytes.
struct Partial {
    file: tokio::fs::File,
    len: u64,
    hasher: Hasher,
}

/// Opens `blobs/<etag>.incomplete` and hashes what it already holds (longer than the
/// file can be: emptied).
fn open_partial(path: &Path, file: &HubFile) -> Result<Partial, Error> {
    let io = |e| Error::io(path, e);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(io)?;
    let mut len = f.metadata().map_err(io)?.len();
    if len > file.size {
        f.set_len(0).map_err(io)?;
        len = 0;
    }
    let mut hasher = file.expected.hasher(file.size);
    let mut buf = vec![0u8; WRITE_BUFFER];
    let mut left = len;
    while left > 0 {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        left = left.saturating_sub(n as u64);
    }
    f.seek(std::io::SeekFrom::Start(len)).map_err(io)?;
    Ok(Partial {
        file: tokio::fs::File::from_std(f),
        len,
        hasher,
    })
}

/// The start offset of a `206` answer's `Content-Range: bytes <start>-<end>/<total>`.
pub fn content_range_start(value: &str) -> Option<u64> {
    let range = value.trim().strip_prefix("bytes ")?;
    let (span, _total) = range.split_once('/')?;
    let (start, _end) = span.split_once('-')?;
    start.trim().parse().ok()
}

/// Fetches `file` of `commit` into `layout`'s `blobs/<etag>` unless it is there, under
/// huggingface_hub's per-blob lock, retrying transient failures `retries` times (each
/// retry resuming from the bytes on disk).
pub async fn fetch_blob(
    hub: &Hub,
    repo: &RepoId,
    commit: &str,
    file: &HubFile,
    layout: &RepoLayout,
    retries: u32,
) -> Result<Fetched, Error> {
    check_file_path(&file.path)?;
    check_etag(file.etag())?;
    let blob = layout.blob(file.etag());
    if blob.is_file() {
        return Ok(Fetched {
            cached: true,
            ..Fetched::default()
        });
    }
    for dir in [layout.blobs(), layout.locks.clone()] {
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| Error::io(&dir, e))?;
    }
    let _lock = lock(&layout.blob_lock(file.etag())).await?;
    if blob.is_file() {
        // Another process finished it while this one waited for the lock.
        return Ok(Fetched {
            cached: true,
            ..Fetched::default()
        });
    }
    let incomplete = layout.incomplete(file.etag());
    let mut fetched = Fetched::default();
    let mut attempt = 0;
    loop {
        match attempt_once(hub, repo, commit, file, &incomplete, &mut fetched).await {
            Ok(()) => break,
            Err(e) if e.transient() && attempt < retries => {
                attempt += 1;
                tracing::warn!(file = %file.path, attempt, error = %e, "download interrupted; resuming");
                tokio::time::sleep(Duration::from_millis(200 << attempt.min(5))).await;
            }
            Err(e) => return Err(e),
        }
    }
    tokio::fs::rename(&incomplete, &blob)
        .await
        .map_err(|e| Error::io(&blob, e))?;
    Ok(fetched)
}

/// One request: from the partial file's end to the file's end, then the checks.
async fn attempt_once(
    hub: &Hub,
    repo: &RepoId,
    commit: &str,
    file: &HubFile,
    incomplete: &Path,
    fetched: &mut Fetched,
) -> Result<(), Error> {
    let path = incomplete.to_path_buf();
    let hub_file = file.clone();
    let mut partial = tokio::task::spawn_blocking(move || open_partial(&path, &hub_file))
        .await
        .map_err(|e| Error::io(incomplete, std::io::Error::other(e)))??;
    let io = |e| Error::io(incomplete, e);
    if partial.len < file.size {
        let timeout = hub.timeouts().for_bytes(file.size - partial.len);
        let deadline = Instant::now() + timeout;
        let mut response = hub
            .get_file(repo, commit, &file.path, partial.len, deadline)
            .await?;
        let what = format!("{repo}/{}", file.path);
        match response.status().as_u16() {
            206 => {
                let start = response
                    .headers()
                    .get(reqwest::header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(content_range_start);
                if start != Some(partial.len) {
                    return Err(Error::Protocol {
                        what,
                        message: format!(
                            "asked for bytes from {}, the answer's Content-Range starts at {start:?}",
                            partial.len
                        ),
                    });
                }
                fetched.resumed += 1;
            }
            416 => {
                // The hub has nothing past our length: start over.
                partial.file.set_len(0).await.map_err(io)?;
                return Err(Error::Transport {
                    what,
                    message: "416 to a Range request; restarting from 0".into(),
                });
            }
            _ if partial.len > 0 => {
                // A `200` to a `Range` request: the whole file comes, from 0.
                partial.file.set_len(0).await.map_err(io)?;
                partial
                    .file
                    .seek(std::io::SeekFrom::Start(0))
                    .await
                    .map_err(io)?;
                partial.len = 0;
                partial.hasher = file.expected.hasher(file.size);
            }
            _ => {}
        }
        let mut out = tokio::io::BufWriter::with_capacity(WRITE_BUFFER, partial.file);
        let result = loop {
            let chunk = match tokio::time::timeout_at(deadline, response.chunk()).await {
                Err(_) => {
                    break Err(Error::Transport {
                        what: what.clone(),
                        message: format!("timed out after {}s", timeout.as_secs()),
                    });
                }
                Ok(Err(e)) => break Err(transport(&what, &e)),
                Ok(Ok(None)) => break Ok(()),
                Ok(Ok(Some(chunk))) => chunk,
            };
            fetched.received += chunk.len() as u64;
            if partial.len + chunk.len() as u64 > file.size {
                // More than listed: not the listed content. Nothing kept.
                drop(out);
                let _ = tokio::fs::remove_file(incomplete).await;
                return Err(Error::Size {
                    path: file.path.clone(),
                    expected: file.size,
                    got: partial.len + chunk.len() as u64,
                });
            }
            partial.hasher.update(&chunk);
            partial.len += chunk.len() as u64;
            if let Err(e) = out.write_all(&chunk).await {
                break Err(io(e));
            }
        };
        // What arrived stays on disk for the next attempt, even after an error.
        out.flush().await.map_err(io)?;
        result?;
        if partial.len < file.size {
            return Err(Error::Transport {
                what,
                message: format!(
                    "the connection ended after {} of {} bytes",
                    partial.len, file.size
                ),
            });
        }
        out.get_ref().sync_data().await.map_err(io)?;
    }
    let actual = partial.hasher.finish();
    if actual != file.etag() {
        let _ = tokio::fs::remove_file(incomplete).await;
        return Err(Error::Digest {
            path: file.path.clone(),
            algorithm: file.expected.algorithm(),
            expected: file.etag().to_string(),
            actual,
        });
    }
    Ok(())
}

/// Takes the exclusive lock huggingface_hub takes around a blob (`flock` on
/// `.locks/<repo>/<etag>.lock`, Python's `filelock` on Unix), so a pull and a Python
/// download of the same blob never write it at once.
pub(crate) async fn lock(path: &Path) -> Result<std::fs::File, Error> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        f.lock().map_err(|e| Error::io(&path, e))?;
        Ok(f)
    })
    .await
    .map_err(|e| Error::io("lock", std::io::Error::other(e)))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_gives_the_start() {
        assert_eq!(content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(content_range_start("bytes 0-0/1"), Some(0));
        assert_eq!(content_range_start("bytes */200"), None);
        assert_eq!(content_range_start("items 1-2/3"), None);
    }
}
