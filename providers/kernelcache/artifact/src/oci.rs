//! Pulling cache images: tag to digest, and staging a pinned digest on a node.
//!
//! Only digests are ever pulled. The manifest, the config and the layer are each checked
//! against their digests (the manifest against the pinned one); the layer is extracted
//! (safely) into a staging directory as it streams, and that directory is renamed into
//! `<root>/<namespace>/<name>/<digest>` only once the whole layer matched its digest. A
//! tampered or malformed image leaves no cache directory behind. Every registry read is
//! bounded in bytes and time ([`crate::registry`]): the layer by the size its descriptor
//! declares, which must be within the extraction limit before a byte is downloaded.

use std::path::{Path, PathBuf};

use oci_client::Reference;
use oci_client::manifest::{
    IMAGE_DOCKER_LAYER_GZIP_MEDIA_TYPE, IMAGE_LAYER_GZIP_MEDIA_TYPE, OciImageManifest,
};
use oci_client::secrets::RegistryAuth;

use crate::extract::{self, ExtractError, Extracted, Limits};
use crate::image::{self, CacheImage, CacheType, ImageError};
use crate::registry::{self, RegistryError, Timeouts};

/// An image config larger than this is refused (real ones are a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Chunks of a layer between its download and its extraction (each at most what one
/// read of the connection gave, a few hundred KiB).
const CHUNKS_IN_FLIGHT: usize = 16;
use crate::{files, triton};

/// Why a cache image could not be resolved or staged.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The reference does not parse.
    #[error("invalid image reference {0:?}: {1}")]
    Reference(String, String),
    /// Staging needs a digest, never a tag.
    #[error("{0} is not pinned to a digest")]
    NotPinned(String),
    /// The tag now points elsewhere than the pinned digest.
    #[error("tag {reference} moved: pinned {pinned}, now {current}")]
    TagMoved {
        /// The tagged reference.
        reference: String,
        /// The digest pinned.
        pinned: String,
        /// What the tag resolves to now.
        current: String,
    },
    /// The registry refused or failed, or content did not match its digest or size.
    #[error("registry: {0}")]
    Registry(#[from] RegistryError),
    /// The image is not a kernel cache (labels).
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The image's layout is not the cache format (layers, media types, manifest).
    #[error("image layout: {0}")]
    Layout(String),
    /// The layer could not be extracted safely.
    #[error("extracting: {0}")]
    Extract(#[from] ExtractError),
    /// Local files.
    #[error("{0}")]
    Io(String),
}

impl PullError {
    /// Whether trying again later may help (the registry timed out, was unreachable, or
    /// answered `429` or `5xx`).
    pub fn is_transient(&self) -> bool {
        matches!(self, PullError::Registry(e) if e.transient)
    }
}

/// What staging produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staged {
    /// The cache's self-description.
    pub image: CacheImage,
    /// Where it is on disk.
    pub dir: PathBuf,
    /// What extraction wrote.
    pub extracted: Extracted,
}

/// A registry client for cache images.
pub struct Puller {
    client: registry::Client,
}

impl std::fmt::Debug for Puller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Puller").finish_non_exhaustive()
    }
}

impl Puller {
    /// A client using `auth`; registries in `plain_http` are spoken to over HTTP.
    pub fn new(auth: RegistryAuth, plain_http: Vec<String>) -> Self {
        Self::with_timeouts(auth, plain_http, Timeouts::default())
    }

    /// [`Puller::new`] with other time limits.
    pub fn with_timeouts(auth: RegistryAuth, plain_http: Vec<String>, timeouts: Timeouts) -> Self {
        Self {
            client: registry::Client::new(auth, plain_http, timeouts),
        }
    }

    /// The bounded registry client underneath (OCI model artifacts pull through it).
    pub(crate) fn registry(&self) -> &registry::Client {
        &self.client
    }

    /// Resolve a reference (tag or digest) to the digest of its manifest.
    pub async fn resolve(&self, image: &str) -> Result<String, PullError> {
        let reference = parse(image)?;
        Ok(self.client.resolve(&reference).await?)
    }

    /// Check that the tag of `image` still points at `pinned`.
    pub async fn check_pin(&self, image: &str, pinned: &str) -> Result<(), PullError> {
        let current = self.resolve(image).await?;
        if current == pinned {
            Ok(())
        } else {
            Err(PullError::TagMoved {
                reference: image.to_string(),
                pinned: pinned.to_string(),
                current,
            })
        }
    }

    /// The manifest and cache description of a pinned image (`repo@sha256:...`).
    pub async fn inspect(&self, pinned: &str) -> Result<(OciImageManifest, CacheImage), PullError> {
        let reference = pinned_reference(pinned)?;
        let raw = self.client.manifest(&reference).await?;
        let manifest: OciImageManifest = serde_json::from_slice(&raw.bytes).map_err(|e| {
            PullError::Layout(format!(
                "the manifest is not a single-platform image manifest (an index? pin a platform's manifest): {e}"
            ))
        })?;
        let config = self
            .client
            .blob_bytes(
                &reference,
                &manifest.config.digest,
                u64::try_from(manifest.config.size).ok(),
                MAX_CONFIG_BYTES,
            )
            .await?;
        let config: serde_json::Value = serde_json::from_slice(&config)
            .map_err(|e| PullError::Layout(format!("image config is not JSON: {e}")))?;
        let cache = image::from_labels(&image::labels_of_config(&config))?;
        match manifest.layers.as_slice() {
            [layer]
                if [
                    IMAGE_LAYER_GZIP_MEDIA_TYPE,
                    IMAGE_DOCKER_LAYER_GZIP_MEDIA_TYPE,
                ]
                .contains(&layer.media_type.as_str()) => {}
            [layer] => {
                return Err(PullError::Layout(format!(
                    "the layer is {}, not a gzip tar",
                    layer.media_type
                )));
            }
            layers => {
                return Err(PullError::Layout(format!(
                    "a cache image has exactly one layer, this one has {}",
                    layers.len()
                )));
            }
        }
        Ok((manifest, cache))
    }

    /// Stage a pinned image under `root` at `<root>/<namespace>/<name>/<digest>`: download
    /// and verify the layer, extract it safely, check its manifest, and for Triton caches
    /// rewrite the group files to `triton_mount` (the path pods see).
    pub async fn stage(
        &self,
        pinned: &str,
        root: &Path,
        namespace: &str,
        name: &str,
        triton_mount: Option<&str>,
        limits: Limits,
    ) -> Result<Staged, PullError> {
        let reference = pinned_reference(pinned)?;
        let digest = reference.digest().unwrap_or_default().replace(':', "-");
        let dir = root.join(namespace).join(name).join(&digest);
        let (manifest, cache) = self.inspect(pinned).await?;
        let layer = &manifest.layers[0];
        let layer_size = u64::try_from(layer.size).unwrap_or(u64::MAX);
        if layer_size > limits.max_bytes {
            return Err(PullError::Extract(ExtractError::TooLarge {
                limit: limits.max_bytes,
            }));
        }
        // Extraction renames a checked directory into place, so an existing one is complete.
        if dir.exists() {
            return Ok(Staged {
                image: cache,
                dir,
                extracted: Extracted {
                    files: 0,
                    bytes: 0,
                    already_present: true,
                },
            });
        }
        // Another cache of the same digest is on disk: link its files instead of
        // downloading them again (N KernelCaches of one image take its space once).
        let extracted = if let Some(source) = same_digest(root, &digest, &dir) {
            link(&source, root, &dir, cache.cache_type, triton_mount).await?
        } else {
            let layer = (reference, layer.digest.as_str(), layer_size);
            self.download(layer, root, &dir, (cache.cache_type, triton_mount), limits)
                .await?
        };
        Ok(Staged {
            image: cache,
            dir,
            extracted,
        })
    }

    /// Download the layer (`reference`, its digest and size) and extract it safely into
    /// `dir` (a part of [`Puller::stage`]): extraction (on a blocking thread) reads the
    /// layer as it arrives, while the download hashes it; the staging directory is
    /// renamed into place only after the whole layer arrived and matched its digest
    /// ([`registry::BlobReader`] ends only then).
    async fn download(
        &self,
        (reference, layer_digest, layer_size): (Reference, &str, u64),
        root: &Path,
        dir: &Path,
        (cache_type, triton_mount): (CacheType, Option<&str>),
        limits: Limits,
    ) -> Result<Extracted, PullError> {
        let (pieces, arriving) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
        let (root, target) = (root.to_path_buf(), dir.to_path_buf());
        let mount = triton_mount.map(str::to_string);
        let extraction = tokio::task::spawn_blocking(move || -> Result<Extracted, PullError> {
            let reader = registry::BlobReader::new(arriving);
            // Triton group files are written already pointing at the mount (not rewritten
            // after: a second pass over every group file); the manifest check runs in the
            // staging directory, so the cache directory appears only complete (a restart
            // can trust it).
            let groups = mount.as_deref().map(|mount| triton::GroupFiles { mount });
            let rewrite = groups
                .as_ref()
                .filter(|_| cache_type == CacheType::Triton)
                .map(|g| g as &dyn extract::Rewrite);
            extract::extract_checked(reader, &root, &target, limits, rewrite, |staging| {
                finish(staging, cache_type, None)
            })
        });
        // At most the declared size is accepted (checked against the limit above), hashed
        // as it streams and checked against the layer digest before the end is sent.
        let pulled = self
            .client
            .blob_stream(&reference, layer_digest, layer_size, pieces)
            .await;
        // Always awaited: on a failed download extraction fails too (its reader ends
        // without the end), and its staging directory is gone before this returns.
        let extracted = extraction
            .await
            .map_err(|e| PullError::Io(format!("extraction task: {e}")))?;
        // A download that failed is the cause, whatever extraction made of its bytes.
        pulled?;
        extracted
    }
}

/// Stage `dir` as hard links to `source`, the complete directory of another cache of the
/// same digest (a part of [`Puller::stage`]): N KernelCaches of one image take its space
/// once, and it is not downloaded again.
async fn link(
    source: &Path,
    root: &Path,
    dir: &Path,
    cache_type: CacheType,
    triton_mount: Option<&str>,
) -> Result<Extracted, PullError> {
    let (source, root, target) = (source.to_path_buf(), root.to_path_buf(), dir.to_path_buf());
    let mount = triton_mount.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        extract::link_checked(&source, &root, &target, |staging| {
            finish(staging, cache_type, mount.as_deref())
        })
    })
    .await
    .map_err(|e| PullError::Io(format!("linking task: {e}")))?
}

/// After extraction: the layer must hold the cache directory and a manifest that parses;
/// Triton group files are rewritten to `triton_mount` when given (those of a cache linked
/// from another: extraction writes them right in the first place).
fn finish(dir: &Path, cache_type: CacheType, triton_mount: Option<&str>) -> Result<(), PullError> {
    let manifest = files::read_bounded(
        &dir.join(cache_type.manifest_path()),
        image::MAX_MANIFEST_BYTES,
    )
    .map_err(|e| {
        PullError::Layout(format!(
            "the layer has no readable {}: {e}",
            cache_type.manifest_path()
        ))
    })?;
    image::manifest_targets(cache_type, &manifest)?;
    let cache_dir = dir.join(cache_type.cache_dir());
    if !cache_dir.is_dir() {
        return Err(PullError::Layout(format!(
            "the layer has no {}/",
            cache_type.cache_dir()
        )));
    }
    if let (CacheType::Triton, Some(mount)) = (cache_type, triton_mount) {
        triton::rewrite_group_files(&cache_dir, mount)
            .map_err(|e| PullError::Io(format!("rewriting Triton group files: {e}")))?;
    }
    Ok(())
}

/// A complete directory of `digest` (as a directory name) under `root`, other than
/// `except`: `<root>/<namespace>/<name>/<digest>`, real directories only.
fn same_digest(root: &Path, digest: &str, except: &Path) -> Option<PathBuf> {
    let dirs = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect()
    };
    dirs(root)
        .iter()
        .flat_map(|ns| dirs(ns))
        .map(|name| name.join(digest))
        .find(|d| d != except && d.symlink_metadata().is_ok_and(|m| m.is_dir()))
}

fn parse(image: &str) -> Result<Reference, PullError> {
    image
        .parse::<Reference>()
        .map_err(|e| PullError::Reference(image.to_string(), e.to_string()))
}

pub(crate) fn pinned_reference(pinned: &str) -> Result<Reference, PullError> {
    let reference = parse(pinned)?;
    if reference.digest().is_none() {
        return Err(PullError::NotPinned(pinned.to_string()));
    }
    Ok(reference)
}

/// `repo@digest` for an image reference given by tag or digest.
pub fn pin(image: &str, digest: &str) -> Result<String, PullError> {
    let reference = parse(image)?;
    Ok(format!(
        "{}/{}@{digest}",
        reference.registry(),
        reference.repository()
    ))
}
