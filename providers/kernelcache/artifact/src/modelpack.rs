//! OCI model artifacts (`oci://` ModelCache sources): a CNCF ModelPack artifact or a
//! KitOps ModelKit, pulled by digest through the kernel caches' bounded registry client
//! ([`crate::registry`]) and published into the Hugging Face cache layout, so that an
//! engine given the model id and `HF_HUB_OFFLINE=1` finds it as it finds a hub download.
//!
//! This module is the pure part: which manifests are model artifacts, which layer media
//! types are accepted, and what each layer becomes (a file at a path, or a tar extracted
//! at the snapshot's root) — [`plan`]. [`pull`] does the I/O.
//!
//! Formats (modelcache-facts §5):
//! - ModelPack (`artifactType` [`MODELPACK_ARTIFACT_TYPE`] or config
//!   [`MODELPACK_CONFIG`]): layers `application/vnd.cncf.model.<kind>.v1.<packing>`,
//!   kind `weight`, `weight.config`, `doc`, `code`, `dataset`; packing `raw` (one file,
//!   its path in the annotation [`FILEPATH_ANNOTATION`]), `tar`, `tar+gzip`, `tar+zstd`;
//! - KitOps ModelKit (config [`KITOPS_CONFIG`]): layers
//!   `application/vnd.kitops.modelkit.<kind>.v1.tar[+gzip|+zstd]`, kind `model`,
//!   `modelpart`, `dataset`, `code`, `docs`.
//!
//! Any other layer media type is refused by name (never skipped: a model missing a layer
//! it declares is not the model).

pub mod pull;

use std::collections::BTreeSet;

use oci_client::manifest::OciImageManifest;

/// The `artifactType` of a ModelPack manifest.
pub const MODELPACK_ARTIFACT_TYPE: &str = "application/vnd.cncf.model.manifest.v1+json";
/// The config media type of a ModelPack artifact.
pub const MODELPACK_CONFIG: &str = "application/vnd.cncf.model.config.v1+json";
/// The config media type of a KitOps ModelKit (its Kitfile).
pub const KITOPS_CONFIG: &str = "application/vnd.kitops.modelkit.config.v1+json";
/// The layer annotation naming a ModelPack file's path.
pub const FILEPATH_ANNOTATION: &str = "org.cncf.model.filepath";

const MODELPACK_LAYER_PREFIX: &str = "application/vnd.cncf.model.";
const MODELPACK_KINDS: [&str; 5] = ["weight", "weight.config", "doc", "code", "dataset"];
const KITOPS_LAYER_PREFIX: &str = "application/vnd.kitops.modelkit.";
const KITOPS_KINDS: [&str; 5] = ["model", "modelpart", "dataset", "code", "docs"];

/// Which model artifact format a manifest is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A CNCF ModelPack artifact.
    ModelPack,
    /// A KitOps ModelKit.
    KitOps,
}

/// How a layer holds its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packing {
    /// The layer is one file, stored at this path of the snapshot.
    Raw(String),
    /// A tar, extracted at the snapshot's root.
    Tar,
    /// A gzip tar, extracted at the snapshot's root.
    TarGzip,
    /// A zstd tar, extracted at the snapshot's root.
    TarZstd,
}

/// One layer to fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layer {
    /// `sha256:<64 hex>`.
    pub digest: String,
    /// Bytes, as the descriptor declares them.
    pub size: u64,
    /// What it becomes.
    pub packing: Packing,
}

impl Layer {
    /// The 64 hex digits of the digest (a raw layer's blob name in the cache layout: the
    /// sha256 of the file, as the hub names LFS files).
    pub fn hex(&self) -> &str {
        self.digest.strip_prefix("sha256:").unwrap_or(&self.digest)
    }
}

/// What pulling an artifact does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Its format.
    pub format: Format,
    /// Its layers, in the manifest's order.
    pub layers: Vec<Layer>,
}

impl Plan {
    /// Bytes of the layers, each digest once (what is downloaded).
    pub fn total(&self) -> u64 {
        let mut seen = BTreeSet::new();
        self.layers
            .iter()
            .filter(|l| seen.insert(l.digest.as_str()))
            .map(|l| l.size)
            .sum()
    }
}

/// Why an artifact is not a model this can pull.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Neither a ModelPack artifact nor a KitOps ModelKit.
    #[error(
        "not a model artifact: artifactType {artifact_type:?}, config {config:?} (expected a ModelPack artifact, {MODELPACK_ARTIFACT_TYPE}, or a KitOps ModelKit, config {KITOPS_CONFIG})"
    )]
    NotAModel {
        /// The manifest's `artifactType`.
        artifact_type: String,
        /// The config's media type.
        config: String,
    },
    /// A layer media type this does not read.
    #[error("layer {digest}: unsupported media type {media_type}{why}")]
    UnsupportedMediaType {
        /// The layer.
        digest: String,
        /// Its media type.
        media_type: String,
        /// A detail (empty, or starting with `: `).
        why: String,
    },
    /// A layer with no usable file path, or a digest this does not name blobs by.
    #[error("layer {digest}: {why}")]
    BadLayer {
        /// The layer.
        digest: String,
        /// What is wrong.
        why: String,
    },
}

/// What the manifest's layers become, or why it is not pulled (the one place deciding
/// which artifacts and media types are accepted).
pub fn plan(manifest: &OciImageManifest) -> Result<Plan, PlanError> {
    let format = format(manifest)?;
    let mut paths = BTreeSet::new();
    let mut layers = Vec::with_capacity(manifest.layers.len());
    for descriptor in &manifest.layers {
        let digest = descriptor.digest.clone();
        let bad = |why: String| PlanError::BadLayer {
            digest: digest.clone(),
            why,
        };
        let hex = digest.strip_prefix("sha256:").unwrap_or_default();
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad("the digest is not sha256:<64 lowercase hex>".into()));
        }
        let size = u64::try_from(descriptor.size)
            .map_err(|_| bad(format!("negative size {}", descriptor.size)))?;
        let packing = packing(format, &descriptor.media_type).map_err(|why| {
            PlanError::UnsupportedMediaType {
                digest: digest.clone(),
                media_type: descriptor.media_type.clone(),
                why,
            }
        })?;
        let packing = match packing {
            Kind::Raw => {
                let path = descriptor
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(FILEPATH_ANNOTATION))
                    .ok_or_else(|| bad(format!("a raw layer without {FILEPATH_ANNOTATION}")))?;
                check_path(path).map_err(|why| bad(format!("file path {path:?}: {why}")))?;
                if !paths.insert(path.clone()) {
                    return Err(bad(format!("file path {path:?} is in two layers")));
                }
                Packing::Raw(path.clone())
            }
            Kind::Tar => Packing::Tar,
            Kind::TarGzip => Packing::TarGzip,
            Kind::TarZstd => Packing::TarZstd,
        };
        layers.push(Layer {
            digest,
            size,
            packing,
        });
    }
    if layers.is_empty() {
        return Err(PlanError::BadLayer {
            digest: String::new(),
            why: "the artifact has no layers".into(),
        });
    }
    Ok(Plan { format, layers })
}

fn format(manifest: &OciImageManifest) -> Result<Format, PlanError> {
    let artifact_type = manifest.artifact_type.clone().unwrap_or_default();
    let config = manifest.config.media_type.as_str();
    if artifact_type == MODELPACK_ARTIFACT_TYPE || config == MODELPACK_CONFIG {
        Ok(Format::ModelPack)
    } else if config == KITOPS_CONFIG {
        Ok(Format::KitOps)
    } else {
        Err(PlanError::NotAModel {
            artifact_type,
            config: config.to_string(),
        })
    }
}

enum Kind {
    Raw,
    Tar,
    TarGzip,
    TarZstd,
}

/// The packing a layer media type names in `format`, or why it is refused.
fn packing(format: Format, media_type: &str) -> Result<Kind, String> {
    let (prefix, kinds, raw_ok): (&str, &[&str], bool) = match format {
        Format::ModelPack => (MODELPACK_LAYER_PREFIX, &MODELPACK_KINDS, true),
        Format::KitOps => (KITOPS_LAYER_PREFIX, &KITOPS_KINDS, false),
    };
    let Some((kind, packing)) = media_type
        .strip_prefix(prefix)
        .and_then(|rest| rest.rsplit_once(".v1."))
    else {
        return Err(String::new());
    };
    if !kinds.contains(&kind) {
        return Err(String::new());
    }
    match packing {
        "raw" if raw_ok => Ok(Kind::Raw),
        "tar" => Ok(Kind::Tar),
        "tar+gzip" => Ok(Kind::TarGzip),
        "tar+zstd" => Ok(Kind::TarZstd),
        _ => Err(String::new()),
    }
}

/// A file path inside the model: relative, `/`-separated, no `.`/`..`/empty segments
/// (the hub crate's rule for hub file paths, so the snapshot link is safe).
pub fn check_path(path: &str) -> Result<(), String> {
    kubeairunway_modelcache_hub::layout::check_file_path(path).map_err(|e| match e {
        kubeairunway_modelcache_hub::Error::Invalid { why, .. } => why.to_string(),
        other => other.to_string(),
    })
}

/// The snapshot name of an artifact: the first 40 hex digits of its manifest digest.
/// `huggingface_hub` takes a 40-hex revision for a commit (`REGEX_COMMIT_HASH`), so
/// `revision=<this>` works offline too, beside `refs/<revision>` naming it.
pub fn snapshot_id(manifest_digest: &str) -> Option<String> {
    let hex = manifest_digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| hex[..40].to_string())
}

#[cfg(test)]
mod tests;
