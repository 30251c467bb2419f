//! Pulling an OCI model artifact into the Hugging Face cache layout (the I/O around
//! [`super::plan`]).
//!
//! By digest only, through [`Puller`]'s bounded registry client: the manifest is checked
//! against the pinned digest, the config and every layer against theirs. A raw layer
//! streams into a temporary file in `blobs/` and is renamed to `blobs/<sha256>` only once
//! its digest matched (its digest is the file's, as the hub names LFS blobs); a tar layer
//! streams through the hostile-archive extractor ([`crate::extract::unpack_into`]: no
//! absolute paths, no `..`, no symbolic links, hard links only inside, size and entry
//! caps) into a temporary directory, and its files move to `blobs/<their sha256>` only
//! after the whole layer matched its digest. Memory stays bounded (chunks in flight).
//! The snapshot `snapshots/<first 40 hex of the manifest digest>` is published at once
//! (the hub crate's [`publish_snapshot`]) after every layer, then `refs/<revision>`: a
//! tampered or refused artifact publishes nothing. A retry skips the layers whose blobs
//! are complete (no byte-range resume within a layer).

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use kubeairunway_modelcache_hub::RepoId;
use kubeairunway_modelcache_hub::layout::{RepoLayout, check_revision};
use kubeairunway_modelcache_hub::pull::{available, publish_snapshot, write_ref};
use oci_client::Reference;
use oci_client::manifest::OciImageManifest;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;

use super::{Layer, Packing, Plan, PlanError, check_path, plan, snapshot_id};
use crate::extract::{self, Compression, ExtractError, Limits};
use crate::oci::{MAX_CONFIG_BYTES, PullError, Puller, pinned_reference};
use crate::registry::{self, Piece, RegistryError};

/// Chunks of a layer between its download and the disk.
const CHUNKS_IN_FLIGHT: usize = 16;

/// Why a model artifact was not pulled.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The reference does not parse or is not pinned.
    #[error(transparent)]
    Reference(PullError),
    /// Not a model artifact, or a layer this does not read.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The registry refused or failed, or content did not match its digest or size.
    #[error("registry: {0}")]
    Registry(#[from] RegistryError),
    /// A tar layer could not be extracted safely.
    #[error("extracting: {0}")]
    Extract(#[from] ExtractError),
    /// The cache layout (publishing the snapshot or the ref).
    #[error(transparent)]
    Layout(#[from] kubeairunway_modelcache_hub::Error),
    /// Local files.
    #[error("{0}")]
    Io(String),
}

impl ModelError {
    /// Whether trying again later may help.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Registry(e) if e.transient)
    }
}

fn io(context: &str) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |e| ModelError::Io(format!("{context}: {e}"))
}

/// A model artifact, inspected: its manifest checked and planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspected {
    /// `registry/repo@sha256:...`.
    pub pinned: String,
    /// The manifest's digest.
    pub digest: String,
    /// The snapshot it is published as ([`snapshot_id`]).
    pub snapshot: String,
    /// What its layers become.
    pub plan: Plan,
}

/// Where a model artifact goes.
#[derive(Clone, Debug)]
pub struct Target<'a> {
    /// `HF_HUB_CACHE`.
    pub cache_dir: &'a Path,
    /// The model id engines are given.
    pub model_id: &'a RepoId,
    /// The ref written (`main` for engines that name no revision).
    pub revision: &'a str,
    /// Caps on each tar layer's content.
    pub limits: Limits,
    /// Refuse to start (`NoSpace`) when the file system has less room than the bytes
    /// still to download (the node agent checks before, with its floor).
    pub check_space: bool,
}

/// What a pull did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelReport {
    /// `snapshots/<id>`.
    pub snapshot: PathBuf,
    /// The snapshot id (the "commit").
    pub commit: String,
    /// Files in the snapshot (0 when it was complete on disk).
    pub files: usize,
    /// Bytes of the artifact's layers.
    pub bytes_total: u64,
    /// Bytes received from the registry.
    pub bytes_received: u64,
}

/// Bytes still to download for `inspected` into `layout`: raw layers whose blob is not
/// there, every tar layer unless the snapshot is complete.
pub fn missing_bytes(layout: &RepoLayout, inspected: &Inspected) -> u64 {
    if layout.snapshot(&inspected.snapshot).is_dir() {
        return 0;
    }
    let mut seen = std::collections::BTreeSet::new();
    inspected
        .plan
        .layers
        .iter()
        .filter(|l| seen.insert(l.digest.as_str()))
        .filter(|l| !matches!(l.packing, Packing::Raw(_)) || !layout.blob(l.hex()).is_file())
        .map(|l| l.size)
        .sum()
}

impl Puller {
    /// The manifest of a pinned model artifact (checked against its digest), its config
    /// (checked against its own) and what its layers become.
    pub async fn inspect_model(&self, pinned: &str) -> Result<Inspected, ModelError> {
        let reference = pinned_reference(pinned).map_err(ModelError::Reference)?;
        let raw = self.registry().manifest(&reference).await?;
        let manifest: OciImageManifest =
            serde_json::from_slice(&raw.bytes).map_err(|e| PlanError::BadLayer {
                digest: raw.digest.clone(),
                why: format!("the manifest is not a single OCI manifest (an index?): {e}"),
            })?;
        let plan = plan(&manifest)?;
        self.registry()
            .blob_bytes(
                &reference,
                &manifest.config.digest,
                u64::try_from(manifest.config.size).ok(),
                MAX_CONFIG_BYTES,
            )
            .await?;
        let snapshot = snapshot_id(&raw.digest).unwrap_or_default();
        Ok(Inspected {
            pinned: pinned.to_string(),
            digest: raw.digest,
            snapshot,
            plan,
        })
    }

    /// Pulls an inspected artifact into `target` and publishes its snapshot and ref.
    pub async fn pull_model(
        &self,
        inspected: &Inspected,
        target: &Target<'_>,
    ) -> Result<ModelReport, ModelError> {
        check_revision(target.revision)?;
        let reference = pinned_reference(&inspected.pinned).map_err(ModelError::Reference)?;
        let layout = RepoLayout::new(target.cache_dir, target.model_id);
        let blobs = layout.blobs();
        tokio::fs::create_dir_all(&blobs)
            .await
            .map_err(io("creating the blobs directory"))?;
        if target.check_space {
            let needed = missing_bytes(&layout, inspected);
            let available = available(&blobs)?;
            if needed > available {
                return Err(kubeairunway_modelcache_hub::Error::NoSpace {
                    dir: blobs,
                    needed,
                    available,
                }
                .into());
            }
        }
        let commit = inspected.snapshot.clone();
        let total = inspected.plan.total();
        let mut received = 0;
        let mut links: BTreeMap<String, String> = BTreeMap::new();
        if !layout.snapshot(&commit).is_dir() {
            for layer in &inspected.plan.layers {
                let (files, got) = self.layer(&reference, layer, &blobs, target.limits).await?;
                received += got;
                for (path, etag) in files {
                    if links.get(&path).is_some_and(|e| *e != etag) {
                        return Err(PlanError::BadLayer {
                            digest: layer.digest.clone(),
                            why: format!("file path {path:?} is in two layers"),
                        }
                        .into());
                    }
                    links.insert(path, etag);
                }
            }
        }
        let links: Vec<(String, String)> = links.into_iter().collect();
        let snapshot = publish_snapshot(&layout, &commit, &links).await?;
        write_ref(&layout, target.revision, &commit).await?;
        Ok(ModelReport {
            snapshot,
            commit,
            files: links.len(),
            bytes_total: total,
            bytes_received: received,
        })
    }

    /// One layer into `blobs/`: its files as (path, blob name), and the bytes received.
    async fn layer(
        &self,
        reference: &Reference,
        layer: &Layer,
        blobs: &Path,
        limits: Limits,
    ) -> Result<(Vec<(String, String)>, u64), ModelError> {
        match &layer.packing {
            Packing::Raw(path) => {
                let got = self.raw(reference, layer, blobs).await?;
                Ok((vec![(path.clone(), layer.hex().to_string())], got))
            }
            Packing::Tar => {
                self.tar(reference, layer, Compression::None, blobs, limits)
                    .await
            }
            Packing::TarGzip => {
                self.tar(reference, layer, Compression::Gzip, blobs, limits)
                    .await
            }
            Packing::TarZstd => {
                self.tar(reference, layer, Compression::Zstd, blobs, limits)
                    .await
            }
        }
    }

    /// A raw layer to `blobs/<hex>` (skipped when there): streamed into a temporary file,
    /// renamed only once its size and digest matched.
    async fn raw(
        &self,
        reference: &Reference,
        layer: &Layer,
        blobs: &Path,
    ) -> Result<u64, ModelError> {
        let blob = blobs.join(layer.hex());
        if blob.is_file() {
            return Ok(0);
        }
        let temp = tempfile::Builder::new()
            .prefix(".oci-")
            .tempfile_in(blobs)
            .map_err(io("creating a temporary blob"))?;
        let file =
            tokio::fs::File::from_std(temp.reopen().map_err(io("opening a temporary blob"))?);
        let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
        let (pulled, written) = tokio::join!(
            self.registry()
                .blob_stream(reference, &layer.digest, layer.size, tx),
            write_pieces(file, rx)
        );
        // A download that failed is the cause, whatever the writer made of its bytes.
        let got = pulled?;
        if !written.map_err(io("writing a blob"))? {
            return Err(ModelError::Io(format!(
                "layer {}: the download ended unverified",
                layer.digest
            )));
        }
        temp.persist(&blob)
            .map_err(|e| ModelError::Io(format!("moving {} into place: {e}", blob.display())))?;
        Ok(got)
    }

    /// A tar layer through the safe extractor into a temporary directory; its files move
    /// into `blobs/` (named by their sha256) only after the whole layer matched its digest.
    async fn tar(
        &self,
        reference: &Reference,
        layer: &Layer,
        compression: Compression,
        blobs: &Path,
        limits: Limits,
    ) -> Result<(Vec<(String, String)>, u64), ModelError> {
        let staging = tempfile::Builder::new()
            .prefix(".oci-layer-")
            .tempdir_in(blobs)
            .map_err(io("creating a staging directory"))?;
        let (dir, blobs_dir) = (staging.path().to_path_buf(), blobs.to_path_buf());
        let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
        let extraction = tokio::task::spawn_blocking(move || {
            let reader = registry::BlobReader::new(rx);
            // `unpack_into` reads the layer to its end, and the reader ends only after the
            // digest matched: past this line the files are the layer's.
            extract::unpack_into(reader, compression, &dir, limits)?;
            adopt(&dir, &blobs_dir)
        });
        let pulled = self
            .registry()
            .blob_stream(reference, &layer.digest, layer.size, tx)
            .await;
        let adopted = extraction
            .await
            .map_err(|e| ModelError::Io(format!("extraction task: {e}")))?;
        let got = pulled?;
        drop(staging);
        Ok((adopted?, got))
    }
}

/// Writes the pieces of a blob to `file`; whether the end ([`Piece::Verified`]) came.
async fn write_pieces(
    mut file: tokio::fs::File,
    mut pieces: tokio::sync::mpsc::Receiver<Piece>,
) -> std::io::Result<bool> {
    let mut verified = false;
    while let Some(piece) = pieces.recv().await {
        match piece {
            Piece::Bytes(bytes) => file.write_all(&bytes).await?,
            Piece::Verified => verified = true,
        }
    }
    file.flush().await?;
    file.sync_all().await?;
    Ok(verified)
}

/// Moves every regular file under `dir` to `blobs/<its sha256>` (a blob already there
/// is kept); returns (path in the layer, blob name) of each.
fn adopt(dir: &Path, blobs: &Path) -> Result<Vec<(String, String)>, ModelError> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        let entries = std::fs::read_dir(&current).map_err(io("reading an extracted layer"))?;
        for entry in entries {
            let path = entry.map_err(io("reading an extracted layer"))?.path();
            let meta = path
                .symlink_metadata()
                .map_err(io("reading an extracted layer"))?;
            if meta.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(dir)
                .ok()
                .and_then(|p| p.to_str())
                .map(str::to_string)
                .ok_or_else(|| ModelError::Io(format!("{} is not UTF-8", path.display())))?;
            check_path(&rel).map_err(|why| PlanError::BadLayer {
                digest: String::new(),
                why: format!("file path {rel:?} in a tar layer: {why}"),
            })?;
            let hex = sha256_file(&path)?;
            let blob = blobs.join(&hex);
            if blob.is_file() {
                std::fs::remove_file(&path).map_err(io("removing a duplicate file"))?;
            } else {
                std::fs::rename(&path, &blob).map_err(io("moving a file into blobs"))?;
            }
            files.push((rel, hex));
        }
    }
    files.sort();
    Ok(files)
}

fn sha256_file(path: &Path) -> Result<String, ModelError> {
    let mut file = std::fs::File::open(path).map_err(io("opening an extracted file"))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(io("reading an extracted file"))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(registry::hex(&hasher.finalize()))
}
