//! Making a cache image (`kubeairunway cache build`): a Triton cache directory or a vLLM
//! cache root packaged in the GKM/MCV "compat" format ([`kubeairunway_kernelcache_artifact::image`]): one gzip tar
//! layer holding `io.triton.cache/` (or `io.vllm.cache/`) and
//! `io.triton.manifest/manifest.json` (`io.vllm.manifest/...`), an image config with the
//! labels `cache.<type>.image/{entry-count,cache-size-bytes,summary}` computed from the
//! cache's own metadata; pushed with the credentials Docker or Podman keep
//! ([`docker_auth`]); optionally signed with a cosign key ([`crate::sign`]).
//!
//! Triton: every `<hash>/<kernel>.json` with a `target` (`backend`, `arch`, `warp_size`)
//! is a cache entry; the manifest lists them as MCV does (`TritonCacheMetadata`,
//! `mcv/pkg/cache/types.go@f0e65de4` of redhat-et/GKM: `hash`, `ptx_version`,
//! `num_stages`, `num_warps`, `debug`, `backend`, `arch`, `warp_size`; not `dummy_key`,
//! which MCV derives from the building host's Triton installation and checks only on
//! `--baremetal` hosts with that installation). vLLM caches are listed as MCV lists them
//! ([`crate::vllm`]) but do not record the GPU they were built for: the targets are given
//! (`--target cuda:90`), checked against any Triton kernel metadata inside. Every target
//! in the summary label has a warp size (MCV's reader compares it; see
//! [`with_warp_size`]). The layer lists files in a stable order with fixed times and
//! owners, so the same directory always gives the same digest.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{IMAGE_CONFIG_MEDIA_TYPE, IMAGE_LAYER_GZIP_MEDIA_TYPE};
use oci_client::secrets::RegistryAuth;
use serde_json::{Value, json};

use kubeairunway_kernelcache_artifact::image::{CacheType, Target, normalize_arch};

pub use crate::error::BuildError;
use crate::error::io;

/// A packaged cache image.
#[derive(Clone, Debug)]
pub struct Built {
    /// The gzip tar layer.
    pub layer: Vec<u8>,
    /// The image config (with the labels).
    pub config: Vec<u8>,
    /// The labels.
    pub labels: BTreeMap<String, String>,
    /// The manifest in the layer.
    pub manifest: Value,
}

/// Package `dir`: a Triton cache directory (`TRITON_CACHE_DIR`) or a vLLM cache root
/// (`VLLM_CACHE_ROOT`, holding `torch_compile_cache/`). `targets` are required for vLLM
/// and, when given for Triton, must agree with the kernels' own ([`targets_of`]).
pub fn package(dir: &Path, cache_type: CacheType, targets: &[Target]) -> Result<Built, BuildError> {
    let files = walk(dir)?;
    if files.is_empty() {
        return Err(BuildError::NotACache(format!(
            "{} holds no files",
            dir.display()
        )));
    }
    let (entries, found) = kernels(dir, &files)?;
    let size = files.iter().map(|(_, bytes)| *bytes).sum::<u64>();
    let targets = targets_of(
        cache_type,
        targets,
        &found,
        dir.join("torch_compile_cache").is_dir(),
    )
    .map_err(|why| BuildError::NotACache(format!("{}: {why}", dir.display())))?;
    let summary = json!({"targets": targets.iter().map(|t| {
        let mut v = json!({"backend": t.backend, "arch": t.arch});
        if let Some(w) = t.warp_size {
            v["warp_size"] = json!(w);
        }
        v
    }).collect::<Vec<_>>()});
    let prefix = format!("{}.image/", cache_type.as_str());
    let mut labels = BTreeMap::from([(format!("cache.{prefix}summary"), summary.to_string())]);
    let (manifest, entry_count) = match cache_type {
        CacheType::Triton => (json!({"triton": entries}), entries.len()),
        CacheType::Vllm => {
            let listed = crate::vllm::list(dir, |triton| Ok(kernels(triton, &walk(triton)?)?.0))?;
            labels.insert(format!("cache.{prefix}format"), listed.format());
            labels.extend(listed.kserve_labels());
            (listed.manifest(), listed.count)
        }
    };
    labels.insert(
        format!("cache.{prefix}entry-count"),
        entry_count.to_string(),
    );
    labels.insert(format!("cache.{prefix}cache-size-bytes"), size.to_string());
    let layer = layer(dir, &files, cache_type, &manifest)?;
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": []},
    }))
    .map_err(|e| BuildError::Registry(e.to_string()))?;
    Ok(Built {
        layer,
        config,
        labels,
        manifest,
    })
}

/// The Triton kernels among `files` of `dir` (a part of [`package`]): their MCV manifest
/// entries, and the distinct targets they were compiled for. Group files (`__grp__*`)
/// are not kernels.
fn kernels(dir: &Path, files: &[(PathBuf, u64)]) -> Result<(Vec<Value>, Vec<Target>), BuildError> {
    let mut entries = Vec::new();
    let mut found: Vec<Target> = Vec::new();
    for (rel, _) in files {
        if rel.extension().is_some_and(|e| e == "json")
            && !rel
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("__grp__"))
            && let Some(entry) = kernel_entry(&dir.join(rel))?
        {
            let t = Target {
                backend: entry["backend"].as_str().unwrap_or_default().to_string(),
                arch: entry["arch"].as_str().unwrap_or_default().to_string(),
                warp_size: entry["warp_size"]
                    .as_u64()
                    .filter(|w| *w != 0)
                    .and_then(|w| u32::try_from(w).ok()),
            };
            if !found.contains(&t) {
                found.push(t);
            }
            entries.push(entry);
        }
    }
    Ok((entries, found))
}

/// The targets a cache image declares: the kernels' own (`found`) for a Triton cache
/// given none; the ones `given`, which must include every kernel's; refused for a vLLM
/// cache given none (vLLM does not record its GPU) or without `torch_compile_cache/`
/// (`compile_cache`).
pub fn targets_of(
    cache_type: CacheType,
    given: &[Target],
    found: &[Target],
    compile_cache: bool,
) -> Result<Vec<Target>, String> {
    let given: Vec<Target> = given.iter().cloned().map(with_warp_size).collect();
    let given = given.as_slice();
    match (cache_type, given.is_empty()) {
        (CacheType::Triton, true) if found.is_empty() => {
            Err("no Triton kernel metadata (<hash>/<kernel>.json with a target)".into())
        }
        (CacheType::Triton, true) => Ok(found.to_vec()),
        (CacheType::Vllm, true) => {
            Err("a vLLM cache does not record its GPU: give the targets (e.g. cuda:90)".into())
        }
        (CacheType::Vllm, false) if !compile_cache => {
            Err("no torch_compile_cache/: give a VLLM_CACHE_ROOT".into())
        }
        (_, false) => match found.iter().find(|f| {
            !given.iter().any(|g| {
                g.backend == f.backend
                    && g.arch == f.arch
                    && (f.warp_size.is_none() || g.warp_size == f.warp_size)
            })
        }) {
            Some(t) => Err(format!(
                "the cache holds kernels for {}:{}, not among the targets given",
                t.backend, t.arch
            )),
            None => Ok(given.to_vec()),
        },
    }
}

/// A target given without a warp size gets the one its GPUs report: 32 for CUDA; for
/// HIP 32 on RDNA (`gfx10*`, `gfx11*`, `gfx12*`, wave32) and 64 elsewhere (CDNA, GCN).
/// Triton records the device's own `warpSize` (`HIPDriver.get_current_target`,
/// `third_party/amd/backend/driver.py@009d1405` of triton-lang/triton); MCV's create
/// fills in 32 or 64 by backend when it sees no GPU (`buildBinaryCacheSummary`,
/// `mcv/pkg/cache/vllm.go@f0e65de4`). MCV's reader requires the summary's warp size to
/// equal the GPU's (`CompareCacheSummaryLabelToGPU`,
/// `mcv/pkg/preflightcheck/utils.go@f0e65de4`), so a target without one fits no GPU
/// there. `hip:gfx90a:32` states one explicitly.
pub fn with_warp_size(mut target: Target) -> Target {
    if target.warp_size.is_none() {
        let rdna = ["gfx10", "gfx11", "gfx12"]
            .iter()
            .any(|p| target.arch.starts_with(p));
        target.warp_size = match target.backend.as_str() {
            "cuda" => Some(32),
            "hip" | "rocm" if rdna => Some(32),
            "hip" | "rocm" => Some(64),
            _ => None,
        };
    }
    target
}

/// A Triton kernel's metadata as an MCV manifest entry (`TritonCacheMetadata`, with Go's
/// `omitempty`: no zero `ptx_version`, `num_stages` or `num_warps`, no false `debug`),
/// when the file is one.
fn kernel_entry(path: &Path) -> Result<Option<Value>, BuildError> {
    let bytes = kubeairunway_kernelcache_artifact::files::read_bounded(path, 16 << 20)
        .map_err(io(format!("reading {}", path.display())))?;
    let Ok(meta) = serde_json::from_slice::<Value>(&bytes) else {
        return Ok(None);
    };
    let target = &meta["target"];
    let (Some(backend), Some(arch)) = (target["backend"].as_str(), target.get("arch")) else {
        return Ok(None);
    };
    let arch = match arch {
        Value::String(s) => normalize_arch(s),
        Value::Number(n) => n.to_string(),
        _ => return Ok(None),
    };
    let mut entry = json!({"hash": meta["hash"]});
    for field in ["ptx_version", "num_stages", "num_warps"] {
        if let Some(n) = meta[field].as_u64().filter(|n| *n != 0) {
            entry[field] = json!(n);
        }
    }
    if meta["debug"] == true {
        entry["debug"] = json!(true);
    }
    entry["backend"] = json!(backend.to_ascii_lowercase());
    entry["arch"] = json!(arch);
    entry["warp_size"] = json!(target["warp_size"].as_u64().unwrap_or(0));
    Ok(Some(entry))
}

/// Regular files below `dir` (relative, sorted) with their sizes; links and special
/// files are refused (the agent would refuse them too).
fn walk(dir: &Path) -> Result<Vec<(PathBuf, u64)>, BuildError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).map_err(io(format!("reading {}", d.display())))? {
            let e = e.map_err(io(format!("reading {}", d.display())))?;
            let meta = e
                .path()
                .symlink_metadata()
                .map_err(io(format!("reading {}", e.path().display())))?;
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() {
                let rel = e
                    .path()
                    .strip_prefix(dir)
                    .map(Path::to_path_buf)
                    .unwrap_or_default();
                out.push((rel, meta.len()));
            } else {
                return Err(BuildError::NotACache(format!(
                    "{} is a link or special file; a cache holds directories and files only",
                    e.path().display()
                )));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The reproducible gzip tar layer.
fn layer(
    dir: &Path,
    files: &[(PathBuf, u64)],
    cache_type: CacheType,
    manifest: &Value,
) -> Result<Vec<u8>, BuildError> {
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::default()));
    builder.mode(tar::HeaderMode::Deterministic);
    let mut add = |path: &str, data: &[u8], mode: u32| -> Result<(), BuildError> {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, data)
            .map_err(io(format!("adding {path}")))
    };
    for (rel, _) in files {
        let path = dir.join(rel);
        let data = fs::read(&path).map_err(io(format!("reading {}", path.display())))?;
        let mode = if fs::metadata(&path)
            .is_ok_and(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
        {
            0o755
        } else {
            0o644
        };
        add(
            &format!("{}/{}", cache_type.cache_dir(), rel.display()),
            &data,
            mode,
        )?;
    }
    let manifest =
        serde_json::to_vec_pretty(manifest).map_err(|e| BuildError::Registry(e.to_string()))?;
    add(cache_type.manifest_path(), &manifest, 0o644)?;
    let mut gz = builder.into_inner().map_err(io("finishing the layer"))?;
    gz.flush().map_err(io("finishing the layer"))?;
    gz.finish().map_err(io("finishing the layer"))
}

/// Push `built` as `image` (`registry/repo:tag`); returns the pinned reference.
pub async fn push(
    built: &Built,
    image: &str,
    auth: &RegistryAuth,
    plain_http: Vec<String>,
) -> Result<String, BuildError> {
    let reference: oci_client::Reference = image
        .parse()
        .map_err(|e| BuildError::Registry(format!("invalid image reference {image:?}: {e}")))?;
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(plain_http),
        ..ClientConfig::default()
    });
    let response = client
        .push(
            &reference,
            &[ImageLayer::new(
                built.layer.clone(),
                IMAGE_LAYER_GZIP_MEDIA_TYPE.into(),
                None,
            )],
            Config::new(built.config.clone(), IMAGE_CONFIG_MEDIA_TYPE.into(), None),
            auth,
            None,
        )
        .await
        .map_err(|e| BuildError::Registry(format!("pushing {image}: {e}")))?;
    let digest = response
        .manifest_url
        .rsplit('/')
        .next()
        .filter(|d| d.starts_with("sha256:"))
        .map(str::to_string)
        .ok_or_else(|| BuildError::Registry(format!("the registry named no digest for {image}")))?;
    kubeairunway_kernelcache_artifact::oci::pin(image, &digest)
        .map_err(|e| BuildError::Registry(e.to_string()))
}

/// The credentials Docker or Podman keep for `registry`: `$REGISTRY_AUTH_FILE`,
/// `$XDG_RUNTIME_DIR/containers/auth.json`, `~/.config/containers/auth.json`,
/// `$DOCKER_CONFIG/config.json` or `~/.docker/config.json`, the first naming the
/// registry (the `auths` entries; credential helpers are not run). Anonymous otherwise.
pub fn docker_auth(registry: &str) -> Result<RegistryAuth, String> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut files: Vec<PathBuf> = Vec::new();
    files.extend(std::env::var_os("REGISTRY_AUTH_FILE").map(PathBuf::from));
    files.extend(
        std::env::var_os("XDG_RUNTIME_DIR").map(|d| PathBuf::from(d).join("containers/auth.json")),
    );
    files.extend(
        home.as_ref()
            .map(|h| h.join(".config/containers/auth.json")),
    );
    files.extend(std::env::var_os("DOCKER_CONFIG").map(|d| PathBuf::from(d).join("config.json")));
    files.extend(home.as_ref().map(|h| h.join(".docker/config.json")));
    for file in files {
        let Ok(bytes) = fs::read(&file) else { continue };
        let name = file.display().to_string();
        let data = BTreeMap::from([(
            ".dockerconfigjson".to_string(),
            k8s_openapi::ByteString(bytes),
        )]);
        let auth = kubeairunway_kernelcache_artifact::credentials::registry_auth(
            registry,
            &[(name, data)],
        )
        .map_err(|e| e.to_string())?;
        if auth != RegistryAuth::Anonymous {
            return Ok(auth);
        }
    }
    Ok(RegistryAuth::Anonymous)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/triton-rocm-vector-add/io.triton.cache")
    }

    #[test]
    fn targets_are_the_kernels_own_or_given_and_covering_them() {
        let t = |backend: &str, arch: &str| Target {
            backend: backend.into(),
            arch: arch.into(),
            warp_size: None,
        };
        let (hip, cuda) = (t("hip", "gfx90a"), t("cuda", "90"));
        let found = [hip.clone()];
        assert_eq!(
            targets_of(CacheType::Triton, &[], &found, false),
            Ok(vec![hip.clone()])
        );
        assert!(
            targets_of(CacheType::Triton, &[], &[], false)
                .unwrap_err()
                .contains("no Triton kernel metadata")
        );
        let both = [hip.clone(), cuda.clone()];
        assert_eq!(
            targets_of(CacheType::Triton, &both, &found, false),
            Ok(both.iter().cloned().map(with_warp_size).collect())
        );
        assert_eq!(
            targets_of(
                CacheType::Triton,
                std::slice::from_ref(&cuda),
                &found,
                false
            ),
            Err("the cache holds kernels for hip:gfx90a, not among the targets given".into())
        );
        assert!(
            targets_of(CacheType::Vllm, &[], &[], true)
                .unwrap_err()
                .contains("does not record its GPU")
        );
        assert!(
            targets_of(CacheType::Vllm, std::slice::from_ref(&cuda), &[], false)
                .unwrap_err()
                .contains("no torch_compile_cache/")
        );
        assert_eq!(
            targets_of(CacheType::Vllm, std::slice::from_ref(&cuda), &[], true),
            Ok(vec![with_warp_size(cuda.clone())])
        );
        // A target given without a warp size gets its backend's, so it covers a kernel
        // that states it.
        let cuda32 = Target {
            warp_size: Some(32),
            ..cuda.clone()
        };
        assert_eq!(
            targets_of(
                CacheType::Triton,
                std::slice::from_ref(&cuda),
                std::slice::from_ref(&cuda32),
                false
            ),
            Ok(vec![cuda32])
        );
        assert_eq!(with_warp_size(hip).warp_size, Some(64));
        assert_eq!(with_warp_size(t("hip", "gfx1100")).warp_size, Some(32));
        assert_eq!(with_warp_size(t("hip", "gfx942")).warp_size, Some(64));
        assert_eq!(with_warp_size(t("opencl", "x")).warp_size, None);
    }

    /// A copy of the CUDA vector-add cache whose kernel states a PTX version and debug.
    fn cuda_cache() -> tempfile::TempDir {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/triton-cuda-vector-add/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ");
        let dir = tempfile::tempdir().unwrap();
        let hash = dir
            .path()
            .join("5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ");
        fs::create_dir(&hash).unwrap();
        let mut kernel: Value =
            serde_json::from_slice(&fs::read(src.join("add_kernel.json")).unwrap()).unwrap();
        kernel["ptx_version"] = json!(84);
        kernel["debug"] = json!(true);
        fs::write(hash.join("add_kernel.json"), kernel.to_string()).unwrap();
        fs::copy(
            src.join("__grp__add_kernel.json"),
            hash.join("__grp__add_kernel.json"),
        )
        .unwrap();
        dir
    }

    #[test]
    fn triton_entries_carry_what_mcvs_reader_compares() {
        let dir = cuda_cache();
        let built = package(dir.path(), CacheType::Triton, &[]).unwrap();
        let entry = &built.manifest["triton"][0];
        // The CUDA arch is an int in Triton's metadata and a string in MCV's manifest.
        assert_eq!(entry["arch"], "75");
        assert_eq!(entry["backend"], "cuda");
        assert_eq!(entry["warp_size"], 32);
        assert_eq!(entry["ptx_version"], 84);
        assert_eq!(entry["debug"], true);
        assert!(entry.get("dummy_key").is_none());
        assert_eq!(
            built.labels["cache.triton.image/summary"],
            r#"{"targets":[{"arch":"75","backend":"cuda","warp_size":32}]}"#
        );
    }

    #[test]
    fn vllm_caches_are_listed_and_labelled_as_mcv_does() {
        let root = tempfile::tempdir().unwrap();
        let backbone = root
            .path()
            .join("torch_compile_cache/edf531ca35/rank_0_0/backbone");
        fs::create_dir_all(&backbone).unwrap();
        fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/data/vllm-llama-binary/cache_key_factors.json"),
            backbone.join("cache_key_factors.json"),
        )
        .unwrap();
        fs::write(
            backbone.join("artifact_compile_range_1_2048_subgraph_0"),
            b"artifact",
        )
        .unwrap();
        let cuda = Target {
            backend: "cuda".into(),
            arch: "90".into(),
            warp_size: None,
        };
        let built = package(root.path(), CacheType::Vllm, &[cuda]).unwrap();
        assert_eq!(built.labels["cache.vllm.image/format"], "binary");
        assert_eq!(built.labels["cache.vllm.image/entry-count"], "1");
        assert_eq!(
            built.labels["cache.vllm.image/summary"],
            r#"{"targets":[{"arch":"90","backend":"cuda","warp_size":32}]}"#
        );
        assert_eq!(built.manifest["vllm"][0]["cacheFormat"], "binary");
        assert_eq!(built.manifest["vllm"][0]["vllmHash"], "edf531ca35");
    }

    #[test]
    fn the_real_triton_cache_gets_the_real_labels_and_manifest() {
        let built = package(&example(), CacheType::Triton, &[]).unwrap();
        assert_eq!(built.labels["cache.triton.image/entry-count"], "1");
        assert_eq!(
            built.labels["cache.triton.image/summary"],
            r#"{"targets":[{"arch":"gfx90a","backend":"hip","warp_size":64}]}"#
        );
        let image = kubeairunway_kernelcache_artifact::image::from_labels(&built.labels).unwrap();
        assert_eq!(image.targets[0].arch, "gfx90a");
        let real: Value = serde_json::from_slice(
            &fs::read(example().join("../io.triton.manifest/manifest.json")).unwrap(),
        )
        .unwrap();
        // Every field our manifest writes is the real manifest's (MCV's) value.
        for (k, v) in built.manifest["triton"][0].as_object().unwrap() {
            assert_eq!(&real["triton"][0][k], v, "{k}");
        }
        // The same directory always gives the same layer.
        assert_eq!(
            package(&example(), CacheType::Triton, &[]).unwrap().layer,
            built.layer
        );
        // A vLLM cache needs its targets; a directory without kernels is not a Triton cache.
        assert!(package(&example(), CacheType::Vllm, &[]).is_err());
        let empty = tempfile::tempdir().unwrap();
        assert!(package(empty.path(), CacheType::Triton, &[]).is_err());
    }
}
