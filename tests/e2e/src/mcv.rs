//! GKM's and MCV's side of the kernel-cache image format, for the interop tests: an image
//! laid out exactly as MCV's create lays it out ([`create`]), and the checks MCV's
//! extract makes of an image ([`extract`]). MCV is part of GKM's repository
//! (`redhat-et/GKM`, directory `mcv/`); every rule here cites its code at commit
//! [`GKM_COMMIT`] (`f0e65de4`). Their tools are Go programs that cannot be downloaded
//! here, so these are their code's rules written out, not their code.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::Path;

use anyhow::Context as _;
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use kubeairunway_testcluster::registry::Registry;
use oci_client::Reference;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// The GKM commit the rules are read from.
pub const GKM_COMMIT: &str = "f0e65de484f45cae1c05577b3b2d7880cd515fe8";
/// Docker Schema 2 media types MCV's Docker builder writes (`types.DockerManifestSchema2`,
/// `types.DockerConfigJSON`, `types.DockerLayer` in `schema2ImageFromBuildContext`).
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// See [`DOCKER_MANIFEST`].
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
/// See [`DOCKER_MANIFEST`].
pub const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
/// The OCI gzip layer (Buildah's), the other layer type MCV's extract accepts.
pub const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// An image's three documents.
#[derive(Clone, Debug)]
pub struct Image {
    /// The image manifest.
    pub manifest: Vec<u8>,
    /// The image config.
    pub config: Vec<u8>,
    /// The one gzip tar layer.
    pub layer: Vec<u8>,
}

/// Lay out a cache as MCV's Docker builder does (`schema2ImageFromBuildContext`,
/// `writeCompatLayerTar`, `appendTreeToTar` in `mcv/pkg/imgbuild/schema2image.go`):
///
/// - one tar layer: the staged cache tree under `cache_tag` (`filepath.Walk` order,
///   lexical per directory, the root itself left out), then the manifest directory under
///   `manifest_tag`; each entry's header from `tar.FileInfoHeader` (USTAR: permission
///   bits, the builder's owner, a modification time, directories named with a trailing
///   `/`), names joined with `filepath.Join` (so `./io.vllm.cache` loses its `./`);
///   gzipped as `tarball.LayerFromFile` does;
/// - the config: the labels plus `org.opencontainers.image.title` (the image name's last
///   path part without its tag), `os` linux, `architecture`, `created`, one history
///   entry created by `mcv`, the layer's diff ID;
/// - a Docker Schema 2 manifest with the Docker config and layer media types.
///
/// `manifest` is the `manifest.json` MCV writes (`cache.WriteManifest`, indented).
pub fn create(
    cache_dir: &Path,
    (cache_tag, manifest_tag): (&str, &str),
    manifest: &Value,
    labels: &BTreeMap<String, String>,
    image_name: &str,
) -> anyhow::Result<Image> {
    let staging = tempfile::tempdir()?;
    std::fs::create_dir(staging.path().join("manifest"))?;
    std::fs::write(
        staging.path().join("manifest/manifest.json"),
        serde_json::to_vec_pretty(manifest)?,
    )?;
    let mut tar = Vec::new();
    append_tree(&mut tar, cache_dir, cache_tag)?;
    append_tree(&mut tar, &staging.path().join("manifest"), manifest_tag)?;
    tar.extend_from_slice(&[0; 1024]);
    let diff_id = sha256(&tar);
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&tar)?;
    let layer = gz.finish()?;

    let mut labels = labels.clone();
    let title = image_name.rsplit('/').next().unwrap_or(image_name);
    labels.insert(
        "org.opencontainers.image.title".into(),
        title.split(':').next().unwrap_or(title).into(),
    );
    let created = "2026-08-20T17:30:42.123456789Z";
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "created": created,
        "history": [{"created": created, "created_by": "mcv"}],
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "config": {"Labels": labels},
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": DOCKER_MANIFEST,
        "config": {"mediaType": DOCKER_CONFIG, "size": config.len(), "digest": sha256(&config)},
        "layers": [{"mediaType": DOCKER_LAYER, "size": layer.len(), "digest": sha256(&layer)}],
    }))?;
    Ok(Image {
        manifest,
        config,
        layer,
    })
}

/// `appendTreeToTar`: every entry below `src` (not `src` itself), depth first in
/// lexical order, as `prefix/rel` (`filepath.Join`), directories with a trailing `/`.
fn append_tree(tar: &mut Vec<u8>, src: &Path, prefix: &str) -> anyhow::Result<()> {
    let prefix = prefix.trim_start_matches("./").trim_end_matches('/');
    let mut entries: Vec<_> = std::fs::read_dir(src)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let name = format!("{prefix}/{}", entry.file_name().to_string_lossy());
        let meta = entry.metadata()?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777;
        if meta.is_dir() {
            write_entry(
                tar,
                &format!("{name}/"),
                mode,
                tar::EntryType::Directory,
                &[],
            )?;
            append_tree(tar, &entry.path(), &name)?;
        } else {
            let data = std::fs::read(entry.path())?;
            write_entry(tar, &name, mode, tar::EntryType::Regular, &data)?;
        }
    }
    Ok(())
}

/// One USTAR entry as Go's `tar.Writer` writes a `FileInfoHeader` of a builder running
/// as uid/gid 1000: a name over 100 bytes is split into USTAR's prefix and name at a `/`.
fn write_entry(
    tar: &mut Vec<u8>,
    name: &str,
    mode: u32,
    kind: tar::EntryType,
    data: &[u8],
) -> anyhow::Result<()> {
    let mut header = tar::Header::new_ustar();
    {
        let ustar = header
            .as_ustar_mut()
            .context("a USTAR header is a USTAR header")?;
        let (prefix, rest) = if name.len() <= 100 {
            ("", name)
        } else {
            let cut = name[..name.len().min(156)]
                .rfind('/')
                .filter(|&i| name.len() - i - 1 <= 100 && i <= 155)
                .with_context(|| format!("{name} does not fit a USTAR header"))?;
            (&name[..cut], &name[cut + 1..])
        };
        ustar.name[..rest.len()].copy_from_slice(rest.as_bytes());
        ustar.prefix[..prefix.len()].copy_from_slice(prefix.as_bytes());
    }
    header.set_mode(mode);
    header.set_uid(1000);
    header.set_gid(1000);
    header.set_username("mcv")?;
    header.set_groupname("mcv")?;
    header.set_mtime(1_787_247_042);
    header.set_entry_type(kind);
    header.set_size(data.len() as u64);
    header.set_cksum();
    tar.extend_from_slice(header.as_bytes());
    tar.extend_from_slice(data);
    tar.resize(tar.len().next_multiple_of(512), 0);
    Ok(())
}

fn sha256(bytes: &[u8]) -> String {
    format!(
        "sha256:{}",
        kubeairunway_kernelcache_artifact::registry::hex(&Sha256::digest(bytes))
    )
}

/// Push `image` (blobs, then the manifest with its own media type) as
/// `<registry>/<repo_tag>`; returns the reference pinned to the manifest's digest.
pub async fn push(registry: &Registry, repo_tag: &str, image: &Image) -> anyhow::Result<String> {
    let reference: Reference = format!("{}/{repo_tag}", registry.addr()).parse()?;
    let client = crate::cache_images::oci_client();
    for blob in [&image.config, &image.layer] {
        client
            .push_blob(&reference, blob.clone(), &sha256(blob))
            .await?;
    }
    let media_type: Value = serde_json::from_slice(&image.manifest)?;
    let media_type = media_type["mediaType"]
        .as_str()
        .context("the manifest names its media type")?;
    client
        .push_manifest_raw(
            &reference,
            image.manifest.clone(),
            http::HeaderValue::from_str(media_type)?,
        )
        .await?;
    Ok(format!(
        "{}/{}@{}",
        registry.addr(),
        reference.repository(),
        sha256(&image.manifest)
    ))
}

/// Read `pinned` back from the registry as MCV's fetcher sees it: the manifest, the
/// config, and each layer with its media type.
pub async fn pull(registry: &Registry, pinned: &str) -> anyhow::Result<Pulled> {
    use kubeairunway_kernelcache_artifact::registry::{Client, Timeouts};
    let client = Client::new(
        oci_client::secrets::RegistryAuth::Anonymous,
        vec![registry.addr().to_string()],
        Timeouts::default(),
    );
    let reference: Reference = pinned.parse()?;
    let manifest: Value = serde_json::from_slice(&client.manifest(&reference).await?.bytes)?;
    let blob = async |descriptor: &Value| -> anyhow::Result<Vec<u8>> {
        let digest = descriptor["digest"].as_str().context("a digest")?;
        Ok(client
            .blob_bytes(&reference, digest, descriptor["size"].as_u64(), 1 << 30)
            .await?)
    };
    let config: Value = serde_json::from_slice(&blob(&manifest["config"]).await?)?;
    let mut layers = Vec::new();
    for layer in manifest["layers"].as_array().into_iter().flatten() {
        let media_type = layer["mediaType"].as_str().unwrap_or_default().to_string();
        layers.push((media_type, blob(layer).await?));
    }
    Ok(Pulled {
        manifest,
        config,
        layers,
    })
}

/// An image as pulled.
#[derive(Clone, Debug)]
pub struct Pulled {
    /// The manifest.
    pub manifest: Value,
    /// The config.
    pub config: Value,
    /// `(media type, blob)` per layer.
    pub layers: Vec<(String, Vec<u8>)>,
}

/// A GPU as MCV's device layer describes it (`devices.TritonGPUInfo`).
#[derive(Clone, Debug)]
pub struct Gpu {
    /// `cuda` or `hip`.
    pub backend: &'static str,
    /// `75`, `gfx90a`.
    pub arch: &'static str,
    /// 32 or 64.
    pub warp_size: u64,
    /// The CUDA PTX version (0 elsewhere).
    pub ptx_version: u64,
}

/// What MCV's extract wrote.
#[derive(Clone, Debug)]
pub struct Extracted {
    /// `triton` or `vllm`.
    pub cache_type: &'static str,
    /// The cache files, by path below the extract directory.
    pub files: BTreeMap<String, Vec<u8>>,
    /// The manifest it wrote (`/tmp/.mcv/manifest/manifest.json`).
    pub manifest: Value,
}

/// MCV's extract (`cacheExtractor.ExtractCache`, `mcv/pkg/fetcher/imgfetcher.go`) on a
/// host with `gpus`, in `--baremetal` mode (the manifest check too): the labels name the
/// cache type; the summary label fits a GPU; the compat layers (Docker or OCI gzip media
/// type) are unpacked, `io.<type>.cache` into the cache directory and
/// `io.<type>.manifest/manifest.json`; the cache bytes written equal the
/// `cache-size-bytes` label (MCV only warns when they differ; required here, as the
/// format's spec `mcv/docs/spec-compat.md` says); the manifest's entries fit a GPU. The
/// Triton `dummy_key` comparison is left out: MCV derives the key from the host's Triton
/// installation (`ComputeDummyTritonKey`, `mcv/pkg/cache/dummytritonkey.go`).
pub fn extract(image: &Pulled, gpus: &[Gpu]) -> Result<Extracted, String> {
    let labels: BTreeMap<String, String> = image.config["config"]["Labels"]
        .as_object()
        .ok_or("image has no labels")?
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect();
    // DetectCacheTypeFromLabels (mcv/pkg/preflightcheck/utils.go): Triton first.
    let cache_type = if labels.contains_key("cache.triton.image/summary") {
        "triton"
    } else if labels.contains_key("cache.vllm.image/summary") {
        "vllm"
    } else {
        return Err("unknown cache type from labels".into());
    };
    summary_check(&labels, gpus)?;
    let (files, bytes, manifest) = extract_compat(&image.layers, cache_type)?;
    // validateExtractedCacheSize (imgfetcher.go).
    let label = format!("cache.{cache_type}.image/cache-size-bytes");
    let expected: u64 = labels
        .get(&label)
        .ok_or(format!("cache size label {label} not found"))?
        .parse()
        .map_err(|e| format!("invalid cache size in label: {e}"))?;
    if bytes == 0 {
        return Err("no cache bytes extracted".into());
    }
    if bytes != expected {
        return Err(format!(
            "cache size mismatch: expected {expected} bytes, extracted {bytes} bytes"
        ));
    }
    let manifest = manifest.ok_or("failed to read manifest file")?;
    let manifest: Value = serde_json::from_slice(&manifest)
        .map_err(|e| format!("failed to parse manifest JSON: {e}"))?;
    match cache_type {
        "triton" => triton_entries_fit(&manifest["triton"], gpus)?,
        _ => vllm_entries_fit(&manifest, gpus)?,
    }
    Ok(Extracted {
        cache_type,
        files,
        manifest,
    })
}

/// `CompareCacheSummaryLabelToGPU` (`mcv/pkg/preflightcheck/utils.go`): the summary
/// parses as `cache.Summary` (`mcv/pkg/cache/types.go`: `arch` a string, `warp_size` an
/// integer) and some GPU equals a target in backend, arch (`sm_` dropped for CUDA) and
/// warp size.
fn summary_check(labels: &BTreeMap<String, String>, gpus: &[Gpu]) -> Result<(), String> {
    let summary = labels
        .get("cache.triton.image/summary")
        .or_else(|| labels.get("cache.vllm.image/summary"))
        .ok_or("image missing cache summary label")?;
    let summary: Value =
        serde_json::from_str(summary).map_err(|e| format!("failed to parse summary label: {e}"))?;
    let mut targets = Vec::new();
    for t in summary["targets"].as_array().into_iter().flatten() {
        let text = |field: &str| match &t[field] {
            Value::Null => Ok(String::new()),
            Value::String(s) => Ok(s.clone()),
            other => Err(format!(
                "failed to parse summary label: {field} {other} is not a string"
            )),
        };
        let warp =
            go_int(&t["warp_size"]).map_err(|e| format!("failed to parse summary label: {e}"))?;
        targets.push((text("backend")?, text("arch")?, warp));
    }
    let fits = gpus.iter().any(|gpu| {
        targets.iter().any(|(backend, arch, warp)| {
            backend == gpu.backend
                && normalize(backend, arch) == normalize(gpu.backend, gpu.arch)
                && *warp == gpu.warp_size
        })
    });
    if fits {
        Ok(())
    } else {
        Err("no compatible GPU found from summary preflight check".into())
    }
}

/// `normalizeArchForComparison`.
fn normalize(backend: &str, arch: &str) -> String {
    if backend == "cuda" {
        arch.trim_start_matches("sm_").to_string()
    } else {
        arch.to_string()
    }
}

/// A Go `int` field: absent or null is 0, a number must be an integer.
fn go_int(v: &Value) -> Result<u64, String> {
    match v {
        Value::Null => Ok(0),
        Value::Number(n) => n.as_u64().ok_or(format!("{n} is not an int")),
        other => Err(format!("{other} is not an int")),
    }
}

type Unpacked = (BTreeMap<String, Vec<u8>>, u64, Option<Vec<u8>>);

/// `extractCompatImg` (`imgfetcher.go`) and `extractCacheAndManifestDirectory`
/// (`mcv/pkg/cache/cache.go`): layers of a compat media type are gunzipped and
/// untarred; entries named with the cache prefix (`io.triton.cache/`, or
/// `io.vllm.cache` without a slash: `constants.MCVVLLMCacheDir`) or the manifest path
/// are written, others skipped; regular files' bytes below the cache prefix are counted.
fn extract_compat(layers: &[(String, Vec<u8>)], cache_type: &str) -> Result<Unpacked, String> {
    let (cache_prefix, manifest_path) = match cache_type {
        "triton" => ("io.triton.cache/", "io.triton.manifest/manifest.json"),
        _ => ("io.vllm.cache", "io.vllm.manifest/manifest.json"),
    };
    let compat: Vec<&Vec<u8>> = layers
        .iter()
        .filter(|(mt, _)| mt == DOCKER_LAYER || mt == OCI_LAYER)
        .map(|(_, blob)| blob)
        .collect();
    if compat.is_empty() {
        return Err("no compat layers found (expect docker or OCI gzip layer media type)".into());
    }
    let (mut files, mut bytes, mut manifest) = (BTreeMap::new(), 0, None);
    for blob in compat {
        let mut archive = tar::Archive::new(GzDecoder::new(blob.as_slice()));
        let entries = archive
            .entries()
            .map_err(|e| format!("failed to parse layer as tar.gz: {e}"))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| format!("error reading tar archive: {e}"))?;
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let regular = entry.header().entry_type() == tar::EntryType::Regular;
            let mut data = Vec::new();
            if regular {
                entry
                    .read_to_end(&mut data)
                    .map_err(|e| format!("reading {name}: {e}"))?;
            }
            if let Some(rel) = name.strip_prefix(cache_prefix) {
                let rel = rel.trim_matches('/');
                if regular && !rel.is_empty() {
                    bytes += data.len() as u64;
                    files.insert(rel.to_string(), data);
                }
            } else if name.starts_with(manifest_path) && regular {
                manifest = Some(data);
            }
        }
    }
    Ok((files, bytes, manifest))
}

/// `CompareTritonEntriesToGPU` (`mcv/pkg/preflightcheck/triton.go`): entries parse as
/// `TritonCacheMetadata` and one fits a GPU in backend, arch, warp size and, for CUDA,
/// PTX version.
fn triton_entries_fit(entries: &Value, gpus: &[Gpu]) -> Result<(), String> {
    let entries = entries.as_array().filter(|e| !e.is_empty());
    let entries = entries.ok_or("no cache metadata entries provided")?;
    let mut backend_mismatch = false;
    for entry in entries {
        let backend = entry["backend"].as_str().unwrap_or_default();
        let arch = match &entry["arch"] {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => String::new(),
        };
        let warp = go_int(&entry["warp_size"])?;
        let ptx = go_int(&entry["ptx_version"])?;
        go_int(&entry["num_stages"])?;
        go_int(&entry["num_warps"])?;
        for gpu in gpus {
            let fits = backend == gpu.backend
                && normalize(backend, &arch) == normalize(gpu.backend, gpu.arch)
                && warp == gpu.warp_size
                && (backend != "cuda" || ptx == gpu.ptx_version);
            if fits {
                return Ok(());
            }
            backend_mismatch |= backend != gpu.backend;
        }
    }
    Err(if backend_mismatch {
        "incompatibility detected: backend mismatch".into()
    } else {
        "no compatible GPU found".into()
    })
}

/// `CompareVLLMCacheManifestToGPU` (`mcv/pkg/preflightcheck/vllm.go`): every entry has a
/// known `cacheFormat`; `binary` records fit a GPU by backend (`target_device`, default
/// `cuda`) and that backend's warp size; `triton` entries as Triton manifests.
fn vllm_entries_fit(manifest: &Value, gpus: &[Gpu]) -> Result<(), String> {
    for entry in manifest["vllm"].as_array().into_iter().flatten() {
        match entry["cacheFormat"].as_str().unwrap_or_default() {
            "binary" => {
                for record in entry["binary"].as_array().into_iter().flatten() {
                    let backend = record["target_device"]
                        .as_str()
                        .filter(|d| !d.is_empty())
                        .unwrap_or("cuda");
                    let warp = match backend {
                        "rocm" | "hip" => 64,
                        "tpu" => 128,
                        "cpu" => 1,
                        _ => 32,
                    };
                    if !gpus
                        .iter()
                        .any(|g| g.backend == backend && g.warp_size == warp)
                    {
                        return Err(format!(
                            "binary cache entry (backend={backend}, warpSize={warp}) does not match any available GPU"
                        ));
                    }
                }
            }
            "aot_compile" => {
                if entry["aot_compile"].as_array().is_none_or(Vec::is_empty) {
                    return Err("no AOT compile cache entries found".into());
                }
            }
            "triton" => triton_entries_fit(&entry["triton"], gpus)?,
            other => return Err(format!("unknown cache format: {other}")),
        }
    }
    Ok(())
}

/// The files below `dir`, by relative path.
pub fn tree(dir: &Path) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir)?.to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&path)?);
            }
        }
    }
    Ok(out)
}

/// Read every byte of a gzip tar (for tests that look into a layer).
pub fn gunzip(blob: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    GzDecoder::new(blob).read_to_end(&mut out)?;
    Ok(out)
}
