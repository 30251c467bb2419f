//! Model caches on a node: Hugging Face models downloaded into the standard cache layout
//! that vLLM, SGLang and TensorRT-LLM read with `HF_HUB_OFFLINE=1`, every file verified
//! before it becomes visible, downloads resumed after an interruption or a restart.
//! No Kubernetes here: the node agent links this crate, and `kubeairunway cache model
//! pull` runs it locally.
//!
//! - [`layout`]: the cache layout (`models--org--name/{blobs,snapshots,refs}`) as pure
//!   functions, refusing hostile repo ids, revisions and paths before anything touches disk;
//! - [`hash`]: the digests the hub names files by (sha256 for LFS, git blob sha1 else);
//! - [`client`]: the hub API (revision -> commit and file list), errors typed;
//! - [`browse`]: search, parameter counts and `config.json`, for choosing a model;
//! - [`download`]: one file, streamed to `blobs/<etag>.incomplete`, resumed with `Range`,
//!   size and digest checked, then renamed to `blobs/<etag>`;
//! - [`pull`]: a whole revision, in parallel, published as `snapshots/<commit>` at once,
//!   then `refs/<revision>`;
//! - `testing` (feature `testing`): a loopback stand-in of the hub with fault injection.
//!
//! **Why reqwest and not the `hf-hub` crate.** `hf-hub` 1.0 (huggingface/hf-hub) streams a
//! file into a fresh `.incomplete` with no `Range` resume and checks no sha256, and it
//! makes the Xet client (~310 crates) a mandatory dependency; 0.5 resumes but checks no
//! digest either. What is needed here is two GETs (the model info and each file), which
//! reqwest (the same version, with rustls, as the kernel-cache registry client, so no new
//! TLS stack) does with the bounds a node agent needs: a connect and an idle-read timeout,
//! a deadline per request (for a file, longer with its size), capped API bodies and at
//! most 5 redirects, never from HTTPS to HTTP (the hub sends files to its CDN; reqwest
//! drops `Authorization` when a redirect changes host). Files the hub serves only
//! through Xet (over 50 GB, hfpy `constants.py` `MAX_HTTP_DOWNLOAD_SIZE`) are out of reach
//! of plain HTTP, by anyone's client.

pub mod browse;
pub mod client;
pub mod download;
mod error;
pub mod hash;
pub mod layout;
pub mod pull;
#[cfg(feature = "testing")]
pub mod testing;

pub use client::{Hub, HubFile, HubOptions, RevisionInfo};
pub use error::Error;
pub use layout::RepoId;
pub use pull::{FileReport, PullOptions, PullReport, pull, pull_resolved};
