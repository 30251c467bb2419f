//! GKM/MCV interop on a real loopback registry: images laid out exactly as MCV's create
//! lays them out (`kubeairunway_e2e::mcv::create`, each rule citing redhat-et/GKM at
//! `f0e65de4`) stage with our agent's extraction, byte for byte; and what `kubeairunway
//! cache build` pushes passes MCV's extract (`mcv::extract`: labels, summary, compat layer
//! media types, the cache-size check, the manifest check), for Triton (CUDA and ROCm) and
//! vLLM binary caches.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kubeairunway_e2e::cache_images::{CUDA_HASH, data_dir, puller, start_registry};
use kubeairunway_e2e::mcv::{self, Gpu};
use kubeairunway_kernelcache_artifact::extract::Limits;
use kubeairunway_kernelcache_artifact::image::{CacheType, Target};
use kubeairunway_kernelcache_signing::build;
use oci_client::secrets::RegistryAuth;
use serde_json::{Value, json};

const HIP_GFX90A: Gpu = Gpu {
    backend: "hip",
    arch: "gfx90a",
    warp_size: 64,
    ptx_version: 0,
};

const fn cuda(arch: &'static str, ptx_version: u64) -> Gpu {
    Gpu {
        backend: "cuda",
        arch,
        warp_size: 32,
        ptx_version,
    }
}

fn labels(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

fn bytes_of(dir: &Path) -> u64 {
    mcv::tree(dir)
        .unwrap()
        .values()
        .map(|v| v.len() as u64)
        .sum()
}

/// The ROCm vector-add cache directory of the real MCV image.
fn rocm_dir() -> PathBuf {
    data_dir().join("triton-rocm-vector-add/io.triton.cache")
}

/// The CUDA vector-add cache directory (its hash directory only); the kernel's
/// `ptx_version` set to `ptx` when given.
fn cuda_dir(ptx: Option<u64>) -> tempfile::TempDir {
    let src = data_dir().join("triton-cuda-vector-add").join(CUDA_HASH);
    let dir = tempfile::tempdir().unwrap();
    let hash = dir.path().join(CUDA_HASH);
    std::fs::create_dir(&hash).unwrap();
    let mut kernel: Value =
        serde_json::from_slice(&std::fs::read(src.join("add_kernel.json")).unwrap()).unwrap();
    if let Some(ptx) = ptx {
        kernel["ptx_version"] = json!(ptx);
    }
    std::fs::write(hash.join("add_kernel.json"), kernel.to_string()).unwrap();
    std::fs::copy(
        src.join("__grp__add_kernel.json"),
        hash.join("__grp__add_kernel.json"),
    )
    .unwrap();
    dir
}

/// A vLLM cache root in the binary format (the real key factors and model info of
/// MCV's llama example, artifacts of a few bytes).
fn vllm_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let backbone = root
        .path()
        .join("torch_compile_cache/edf531ca35/rank_0_0/backbone");
    std::fs::create_dir_all(&backbone).unwrap();
    let data = data_dir().join("vllm-llama-binary");
    std::fs::copy(
        data.join("cache_key_factors.json"),
        backbone.join("cache_key_factors.json"),
    )
    .unwrap();
    for n in 0..3 {
        std::fs::write(
            backbone.join(format!("artifact_compile_range_1_2048_subgraph_{n}")),
            format!("compiled subgraph {n}"),
        )
        .unwrap();
    }
    std::fs::write(backbone.join("computation_graph.py"), "graph").unwrap();
    std::fs::write(backbone.join("vllm_compile_cache.py"), "{}").unwrap();
    std::fs::create_dir(root.path().join("modelinfos")).unwrap();
    std::fs::copy(
        data.join("modelinfo-LlamaForCausalLM.json"),
        root.path()
            .join("modelinfos/vllm-model_executor-models-llama-LlamaForCausalLM.json"),
    )
    .unwrap();
    root
}

/// The manifest MCV's create writes for [`vllm_root`] (`DetectVLLMCache` and
/// `detectBinaryCache`, `mcv/pkg/cache/vllm.go@f0e65de4`; `VLLMCacheMetadata` and
/// `BinaryCacheMetadata` as `encoding/json` writes them).
fn vllm_manifest() -> Value {
    let factors: Value = serde_json::from_slice(
        &std::fs::read(data_dir().join("vllm-llama-binary/cache_key_factors.json")).unwrap(),
    )
    .unwrap();
    json!({"vllm": [{
        "vllmHash": "edf531ca35",
        "cacheFormat": "binary",
        "binary": [{
            "rank": "rank_0_0",
            "prefix": "backbone",
            "artifact_count": 3,
            "artifact_names": [
                "artifact_compile_range_1_2048_subgraph_0",
                "artifact_compile_range_1_2048_subgraph_1",
                "artifact_compile_range_1_2048_subgraph_2",
            ],
            "code_hash": factors["code_hash"],
            "config_hash": factors["config_hash"],
            "compiler_hash": factors["compiler_hash"],
            "cache_save_format": "binary",
            "target_device": "cuda",
            "env": factors["env"],
        }],
    }]})
}

/// An MCV-laid-out image of each kind: (name, cache directory, cache type, image, the
/// targets our agent must read, a GPU MCV's reader accepts it on).
fn mcv_images() -> Vec<(
    &'static str,
    PathBuf,
    tempfile::TempDir,
    CacheType,
    mcv::Image,
    Target,
    Gpu,
)> {
    let mut out = Vec::new();
    let tags = |t: CacheType| match t {
        CacheType::Triton => ("io.triton.cache/", "io.triton.manifest"),
        CacheType::Vllm => ("./io.vllm.cache", "./io.vllm.manifest"),
    };
    // The real ROCm image's manifest and labels (MCV's own output), over its cache files.
    let keep = tempfile::tempdir().unwrap();
    let real: Value = serde_json::from_slice(
        &std::fs::read(data_dir().join("triton-rocm-vector-add/io.triton.manifest/manifest.json"))
            .unwrap(),
    )
    .unwrap();
    let rocm_labels = labels(&[
        ("cache.triton.image/entry-count", "1".into()),
        (
            "cache.triton.image/cache-size-bytes",
            bytes_of(&rocm_dir()).to_string(),
        ),
        (
            "cache.triton.image/summary",
            r#"{"targets":[{"backend":"hip","arch":"gfx90a","warp_size":64}]}"#.into(),
        ),
    ]);
    let image = mcv::create(
        &rocm_dir(),
        tags(CacheType::Triton),
        &real,
        &rocm_labels,
        "quay.io/gkm/vector-add-cache:rocm",
    )
    .unwrap();
    let hip = Target {
        backend: "hip".into(),
        arch: "gfx90a".into(),
        warp_size: Some(64),
    };
    out.push((
        "rocm",
        rocm_dir(),
        keep,
        CacheType::Triton,
        image,
        hip,
        HIP_GFX90A,
    ));

    // The CUDA cache: MCV's manifest entry (`getTritonMetadata`, mcv/pkg/cache/triton.go;
    // the kernel states no PTX version, so none is written; the dummy key is the
    // building host's) and labels (`TritonCache.Labels`).
    let dir = cuda_dir(None);
    let manifest = json!({"triton": [{
        "hash": "edbea4c0734897ca19ec52852fcc847e552b3b1cfff92cc3deff0b695cdd636f",
        "dummy_key": "9f2c1e0d5b8a7c6e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e",
        "num_stages": 3, "num_warps": 4, "backend": "cuda", "arch": "75", "warp_size": 32,
    }]});
    let cuda_labels = labels(&[
        ("cache.triton.image/entry-count", "1".into()),
        (
            "cache.triton.image/cache-size-bytes",
            bytes_of(dir.path()).to_string(),
        ),
        (
            "cache.triton.image/summary",
            r#"{"targets":[{"backend":"cuda","arch":"75","warp_size":32}]}"#.into(),
        ),
    ]);
    let image = mcv::create(
        dir.path(),
        tags(CacheType::Triton),
        &manifest,
        &cuda_labels,
        "quay.io/example/vector-add-cache:cuda",
    )
    .unwrap();
    let sm75 = Target {
        backend: "cuda".into(),
        arch: "75".into(),
        warp_size: Some(32),
    };
    out.push((
        "cuda",
        dir.path().to_path_buf(),
        dir,
        CacheType::Triton,
        image,
        sm75.clone(),
        cuda("75", 0),
    ));

    // The vLLM binary cache, with the labels MCV's create gives it.
    let root = vllm_root();
    let image = mcv::create(
        root.path(),
        tags(CacheType::Vllm),
        &vllm_manifest(),
        &vllm_labels(root.path()),
        "quay.io/example/llama-cache:binary",
    )
    .unwrap();
    out.push((
        "vllm",
        root.path().to_path_buf(),
        root,
        CacheType::Vllm,
        image,
        sm75,
        cuda("75", 0),
    ));
    out
}

/// The labels MCV's create gives [`vllm_root`] on a host without a GPU
/// (`buildBinaryCacheSummary`, `mcv/pkg/cache/vllm.go@f0e65de4`, falls back to the
/// cache's target device, CUDA arch 75 with the `sm_` prefix, warp size 32 and the CUDA
/// version from its env; `VLLMCache.Labels` adds the format and the KServe
/// kernel-manager hints).
fn vllm_labels(root: &Path) -> BTreeMap<String, String> {
    labels(&[
        ("cache.vllm.image/entry-count", "1".into()),
        ("cache.vllm.image/cache-size-bytes", bytes_of(root).to_string()),
        (
            "cache.vllm.image/summary",
            r#"{"targets":[{"backend":"cuda","arch":"sm_75","warp_size":32,"cuda_version":"12.9"}]}"#.into(),
        ),
        ("cache.vllm.image/format", "binary".into()),
        ("io.kserve.km/framework", "vllm".into()),
        ("io.kserve.km/cache-type", "torch-compile".into()),
        ("io.kserve.km/cache-hash", "edf531ca35".into()),
        ("io.kserve.km/cache-mount-subpath", "torch_compile_cache".into()),
        ("io.kserve.km/cache-root-env", "VLLM_CACHE_ROOT=/home/kserve/.cache/vllm".into()),
    ])
}

#[tokio::test]
async fn images_mcv_builds_stage_with_our_agent_byte_for_byte() {
    let registry = start_registry("mcv-in").unwrap();
    let staging = tempfile::tempdir().unwrap();
    for (name, dir, _keep, cache_type, image, target, gpu) in mcv_images() {
        let pinned = mcv::push(&registry, &format!("mcv/{name}:v1"), &image)
            .await
            .unwrap();
        // The fixture is what MCV's own reader takes (a check of the fixture itself).
        let pulled = mcv::pull(&registry, &pinned).await.unwrap();
        assert_eq!(pulled.manifest["mediaType"], mcv::DOCKER_MANIFEST);
        let theirs = mcv::extract(&pulled, std::slice::from_ref(&gpu))
            .unwrap_or_else(|e| panic!("{name}: MCV's reader refuses the fixture: {e}"));
        assert_eq!(theirs.files, mcv::tree(&dir).unwrap(), "{name}");

        // Our agent stages it: every cache file, byte for byte, and the manifest.
        let staged = puller(&registry)
            .stage(
                &pinned,
                staging.path(),
                "mcv",
                name,
                None,
                Limits::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: our agent refuses MCV's image: {e}"));
        assert_eq!(staged.image.cache_type, cache_type, "{name}");
        assert_eq!(staged.image.targets, [target], "{name}");
        let ours = mcv::tree(&staged.dir.join(cache_type.cache_dir())).unwrap();
        assert_eq!(ours, mcv::tree(&dir).unwrap(), "{name}");
        assert!(
            staged.dir.join(cache_type.manifest_path()).is_file(),
            "{name}"
        );
    }
}

#[test]
fn our_vllm_listing_is_mcvs() {
    // The manifest `cache build` writes for a vLLM cache root is the one MCV writes.
    let root = vllm_root();
    let sm75 = Target {
        backend: "cuda".into(),
        arch: "75".into(),
        warp_size: None,
    };
    let built = build::package(root.path(), CacheType::Vllm, &[sm75]).unwrap();
    assert_eq!(built.manifest, vllm_manifest());
    // Every label MCV's create writes, with MCV's value; only the summary differs in
    // form (MCV detects the building host's GPU and writes `sm_75` and the CUDA version;
    // `cache build` writes the targets given).
    let theirs = vllm_labels(root.path());
    let ours = &built.labels;
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    for (k, v) in &theirs {
        if k != "cache.vllm.image/summary" {
            assert_eq!(&ours[k], v, "{k}");
        }
    }
}

/// `kubeairunway cache build`'s packaging and push (`build::package`, `build::push`).
async fn cache_build(
    registry: &kubeairunway_testcluster::registry::Registry,
    dir: &Path,
    cache_type: CacheType,
    targets: &[Target],
    repo_tag: &str,
) -> mcv::Pulled {
    let built = build::package(dir, cache_type, targets).unwrap();
    let image = format!("{}/{repo_tag}", registry.addr());
    let pinned = build::push(
        &built,
        &image,
        &RegistryAuth::Anonymous,
        vec![registry.addr().to_string()],
    )
    .await
    .unwrap();
    mcv::pull(registry, &pinned).await.unwrap()
}

#[tokio::test]
async fn what_cache_build_pushes_passes_mcvs_extract() {
    let registry = start_registry("mcv-out").unwrap();

    // ROCm Triton: one compat layer; MCV unpacks every file and the sizes agree.
    let pulled = cache_build(
        &registry,
        &rocm_dir(),
        CacheType::Triton,
        &[],
        "ours/rocm:v1",
    )
    .await;
    let layers: Vec<&str> = pulled.layers.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(layers, [mcv::OCI_LAYER]);
    let theirs = mcv::extract(&pulled, &[HIP_GFX90A]).unwrap();
    assert_eq!(theirs.cache_type, "triton");
    assert_eq!(theirs.files, mcv::tree(&rocm_dir()).unwrap());
    assert_eq!(
        theirs.manifest["triton"][0]["hash"],
        json!(ROCM_HASH_KERNEL)
    );
    // Another GPU does not fit the summary.
    let e = mcv::extract(&pulled, &[cuda("75", 0)]).unwrap_err();
    assert!(e.contains("summary preflight"), "{e}");

    // CUDA Triton with a PTX version: MCV's manifest check compares it.
    let dir = cuda_dir(Some(84));
    let pulled = cache_build(
        &registry,
        dir.path(),
        CacheType::Triton,
        &[],
        "ours/cuda:v1",
    )
    .await;
    let theirs = mcv::extract(&pulled, &[cuda("75", 84)]).unwrap();
    assert_eq!(theirs.files, mcv::tree(dir.path()).unwrap());
    let e = mcv::extract(&pulled, &[cuda("75", 83)]).unwrap_err();
    assert_eq!(e, "no compatible GPU found");
    let e = mcv::extract(&pulled, &[cuda("80", 84)]).unwrap_err();
    assert!(e.contains("summary preflight"), "{e}");

    // vLLM binary cache for the target given (no warp size: CUDA's 32 is written).
    let root = vllm_root();
    let sm90 = Target {
        backend: "cuda".into(),
        arch: "90".into(),
        warp_size: None,
    };
    let pulled = cache_build(
        &registry,
        root.path(),
        CacheType::Vllm,
        &[sm90],
        "ours/vllm:v1",
    )
    .await;
    let theirs = mcv::extract(&pulled, &[cuda("90", 86)]).unwrap();
    assert_eq!(theirs.cache_type, "vllm");
    assert_eq!(theirs.files, mcv::tree(root.path()).unwrap());
    assert_eq!(theirs.manifest, vllm_manifest());
    let labels = &pulled.config["config"]["Labels"];
    assert_eq!(labels["cache.vllm.image/format"], "binary");
    let e = mcv::extract(&pulled, &[HIP_GFX90A]).unwrap_err();
    assert!(e.contains("summary preflight"), "{e}");
}

/// The hash Triton recorded in the ROCm kernel's metadata (MCV's manifest `hash`).
const ROCM_HASH_KERNEL: &str = "6088b9b2e5149e06670bcec5bb3df8c56758f20ec349dd5f77f1507fe7cdf5fa";
