//! Real kernel-cache images for the end-to-end tests: compat-format layers built from the
//! example data in `providers/kernelcache/tests/data`, pushed to a loopback registry
//! (Debian's `docker-registry`, started by `kubeairunway_testcluster::registry`), and
//! signed with the sigstore crate the way `cosign sign --key` does.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use flate2::Compression;
use flate2::write::GzEncoder;
use kubeairunway_kernelcache_artifact::oci::{Puller, pin};
use kubeairunway_testcluster::registry::Registry;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{IMAGE_CONFIG_MEDIA_TYPE, IMAGE_LAYER_GZIP_MEDIA_TYPE};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde_json::{Value, json};
use sigstore::cosign::constraint::PrivateKeySigner;
use sigstore::cosign::{ClientBuilder, Constraint as _, CosignCapabilities as _, SignatureLayer};
use sigstore::crypto::{SigStoreSigner, SigningScheme};
use sigstore::registry::{Auth, OciReference};

/// The Triton cache hash directory of the real ROCm vector-add image.
pub const ROCM_HASH: &str = "MCELTMXFCSPAMZYLZ3C3WPPYYVTVR4QOYNE52X3X6FIH7Z6N6X5A";
/// The Triton cache hash directory of the CUDA sm_75 vector-add cache.
pub const CUDA_HASH: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";

/// The kernel-cache example data.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../providers/kernelcache/tests/data")
}

fn read(path: &str) -> anyhow::Result<Vec<u8>> {
    let path = data_dir().join(path);
    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
}

/// A cache image to push: one gzip tar layer and an image config (with the cache labels).
#[derive(Clone, Debug)]
pub struct CacheImage {
    /// The gzip tar layer.
    pub layer: Vec<u8>,
    /// The image config blob.
    pub config: Vec<u8>,
}

/// A gzip tar of `(path, content)` regular files.
pub fn layer(files: &[(&str, &[u8])]) -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, path, *data)?;
    }
    Ok(builder.into_inner()?.finish()?)
}

/// An image config with `labels` (an object of strings).
pub fn config(labels: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": []},
    }))
    .unwrap_or_default()
}

/// The real ROCm (HIP gfx90a) Triton vector-add cache, with its real labels; `extra`
/// files are appended to the layer.
pub fn triton_rocm(extra: &[(&str, &[u8])]) -> anyhow::Result<CacheImage> {
    let grp = read(&format!(
        "triton-rocm-vector-add/io.triton.cache/{ROCM_HASH}/__grp__add_kernel.json"
    ))?;
    let kernel = read(&format!(
        "triton-rocm-vector-add/io.triton.cache/{ROCM_HASH}/add_kernel.json"
    ))?;
    let manifest = read("triton-rocm-vector-add/io.triton.manifest/manifest.json")?;
    let grp_path = format!("io.triton.cache/{ROCM_HASH}/__grp__add_kernel.json");
    let kernel_path = format!("io.triton.cache/{ROCM_HASH}/add_kernel.json");
    let mut files: Vec<(&str, &[u8])> = vec![
        (&grp_path, &grp),
        (&kernel_path, &kernel),
        ("io.triton.manifest/manifest.json", &manifest),
    ];
    files.extend_from_slice(extra);
    let real: Value = serde_json::from_slice(&read("triton-rocm-vector-add/image-config.json")?)?;
    Ok(CacheImage {
        layer: layer(&files)?,
        config: config(&real["config"]["Labels"]),
    })
}

/// The CUDA Triton vector-add cache (its real kernel metadata) rebuilt for compute
/// capability `arch` (e.g. `"90"`), with an MCV manifest and labels naming that target.
pub fn triton_cuda(arch: &str) -> anyhow::Result<CacheImage> {
    let grp = read(&format!(
        "triton-cuda-vector-add/{CUDA_HASH}/__grp__add_kernel.json"
    ))?;
    let mut kernel: Value = serde_json::from_slice(&read(&format!(
        "triton-cuda-vector-add/{CUDA_HASH}/add_kernel.json"
    ))?)?;
    let arch_number: u64 = arch.parse().context("a CUDA arch is a number")?;
    kernel["target"]["arch"] = json!(arch_number);
    let target = json!({"backend": "cuda", "arch": arch_number, "warp_size": 32});
    let manifest = json!({"triton": [{
        "hash": CUDA_HASH, "dummy_key": "0", "num_stages": 3, "num_warps": 4,
        "backend": "cuda", "arch": arch, "warp_size": 32,
    }]});
    let kernel = serde_json::to_vec(&kernel)?;
    let manifest = serde_json::to_vec(&manifest)?;
    let grp_path = format!("io.triton.cache/{CUDA_HASH}/__grp__add_kernel.json");
    let kernel_path = format!("io.triton.cache/{CUDA_HASH}/add_kernel.json");
    let layer = layer(&[
        (&grp_path, &grp),
        (&kernel_path, &kernel),
        ("io.triton.manifest/manifest.json", &manifest),
    ])?;
    let size = grp.len() + kernel.len();
    Ok(CacheImage {
        layer,
        config: config(&json!({
            "cache.triton.image/entry-count": "1",
            "cache.triton.image/cache-size-bytes": size.to_string(),
            "cache.triton.image/summary": json!({"targets": [target]}).to_string(),
        })),
    })
}

/// A vLLM torch.compile cache (the real binary-format key factors and model info) for
/// CUDA compute capability `arch`, in the compat layout (`io.vllm.cache/` is a
/// `VLLM_CACHE_ROOT`).
pub fn vllm_cuda(arch: &str) -> anyhow::Result<CacheImage> {
    let factors = read("vllm-llama-binary/cache_key_factors.json")?;
    let modelinfo = read("vllm-llama-binary/modelinfo-LlamaForCausalLM.json")?;
    let target = json!({"backend": "cuda", "arch": arch, "warp_size": 32});
    let manifest = serde_json::to_vec(&json!({"vllm": [{
        "cache_key": "edf531ca35", "backend": "cuda", "arch": arch, "warp_size": 32,
    }]}))?;
    let layer = layer(&[
        (
            "io.vllm.cache/torch_compile_cache/edf531ca35/rank_0_0/backbone/cache_key_factors.json",
            &factors,
        ),
        (
            "io.vllm.cache/modelinfos/vllm-model_executor-models-llama-LlamaForCausalLM.json",
            &modelinfo,
        ),
        ("io.vllm.manifest/manifest.json", &manifest),
    ])?;
    Ok(CacheImage {
        layer,
        config: config(&json!({
            "cache.vllm.image/entry-count": "1",
            "cache.vllm.image/cache-size-bytes": (factors.len() + modelinfo.len()).to_string(),
            "cache.vllm.image/summary": json!({"targets": [target]}).to_string(),
        })),
    })
}

/// Start a private loopback registry (its data under the test cache's `runs/`).
pub fn start_registry(tag: &str) -> anyhow::Result<Registry> {
    Registry::start(&registry_dir(tag))
}

/// Start a private loopback registry that requires `user` and `password` for every
/// request (the helpers here use them).
pub fn start_registry_with_user(tag: &str, user: &str, password: &str) -> anyhow::Result<Registry> {
    Registry::start_with_user(&registry_dir(tag), user, password)
}

fn registry_dir(tag: &str) -> std::path::PathBuf {
    kubeairunway_testcluster::cache_dir()
        .join("runs")
        .join(format!("{}-registry-{tag}", std::process::id()))
}

/// The credentials `registry` requires (anonymous when it requires none).
pub fn registry_auth(registry: &Registry) -> RegistryAuth {
    registry.user().map_or(RegistryAuth::Anonymous, |(u, p)| {
        RegistryAuth::Basic(u.to_string(), p.to_string())
    })
}

/// An OCI client speaking plain HTTP (the loopback registry).
pub fn oci_client() -> Client {
    Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..ClientConfig::default()
    })
}

/// A puller for the loopback registry.
pub fn puller(registry: &Registry) -> Puller {
    Puller::new(registry_auth(registry), vec![registry.addr().to_string()])
}

/// Push `image` as `<registry>/<repo_tag>` and return that (tag) reference.
pub async fn push(
    registry: &Registry,
    repo_tag: &str,
    image: &CacheImage,
) -> anyhow::Result<String> {
    let reference: Reference = format!("{}/{repo_tag}", registry.addr()).parse()?;
    let layers = [ImageLayer::new(
        image.layer.clone(),
        IMAGE_LAYER_GZIP_MEDIA_TYPE.to_string(),
        None,
    )];
    let config = Config::new(
        image.config.clone(),
        IMAGE_CONFIG_MEDIA_TYPE.to_string(),
        None,
    );
    oci_client()
        .push(&reference, &layers, config, &registry_auth(registry), None)
        .await?;
    Ok(reference.to_string())
}

/// The tag reference `image` pinned to the digest it points at now.
pub async fn pinned(registry: &Registry, image: &str) -> anyhow::Result<String> {
    let digest = puller(registry).resolve(image).await?;
    Ok(pin(image, &digest)?)
}

/// A new ECDSA P-256 signer and its public key (PEM).
pub fn new_signer() -> anyhow::Result<(SigStoreSigner, String)> {
    let signer = SigningScheme::ECDSA_P256_SHA256_ASN1.create_signer()?;
    let public = signer.to_sigstore_keypair()?.public_key_to_pem()?;
    Ok((signer, public))
}

/// Sign `pinned` (`repo@sha256:...`) with `signer` the way `cosign sign --key` does: a
/// simple-signing layer under the `sha256-<hex>.sig` tag.
pub async fn sign(registry: &Registry, pinned: &str, signer: SigStoreSigner) -> anyhow::Result<()> {
    let mut client = ClientBuilder::default()
        .with_oci_client_config(sigstore::registry::ClientConfig {
            protocol: sigstore::registry::ClientProtocol::HttpsExcept(vec![
                registry.addr().to_string(),
            ]),
            ..Default::default()
        })
        .build()?;
    let image: OciReference = pinned.parse()?;
    let auth = registry
        .user()
        .map_or(Auth::Anonymous, |(u, p)| Auth::Basic(u.into(), p.into()));
    let (cosign_image, digest) = client.triangulate(&image, &auth).await?;
    let mut layer = SignatureLayer::new_unsigned(&image, &digest)?;
    anyhow::ensure!(
        PrivateKeySigner::new_with_signer(signer).add_constraint(&mut layer)?,
        "the signer did not sign the layer"
    );
    client
        .push_signature(None, &auth, &cosign_image, vec![layer])
        .await?;
    Ok(())
}
