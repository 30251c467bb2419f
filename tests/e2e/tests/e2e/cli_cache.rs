//! `kubeairunway cache build|verify` against a real OCI registry on loopback (Debian's
//! `docker-registry`), a key pair and signatures made by the real cosign CLI (cosign 3's
//! default Sigstore bundle) and by `cache build` in both formats (its default Sigstore
//! bundle and the legacy simple-signing object, each accepted by `cosign verify --key`),
//! and the KernelCachePolicy of a real API server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kube::Api;
use kube::api::PostParams;
use kubeairunway_cli::crds;
use kubeairunway_e2e::cache_images::{data_dir, start_registry};
use kubeairunway_kernelcache_api::{KernelCachePolicy, KernelCachePolicySpec, VerificationMode};
use kubeairunway_kernelcache_artifact::extract::Limits;
use kubeairunway_kernelcache_artifact::oci::Puller;
use kubeairunway_kernelcache_signing::verify::key_fingerprint;
use oci_client::secrets::RegistryAuth;
use serde_json::Value;

use kubeairunway_e2e::cli::run as kubeairunway;

/// Every file below `dir` with its bytes.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.insert(
                    e.path().strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(e.path()).unwrap(),
                );
            }
        }
    }
    out
}

/// The cosign CLI in `work` (its key pair there), with an empty key password.
struct Cosign {
    bin: PathBuf,
    work: PathBuf,
}

impl Cosign {
    fn run(&self, args: &[&str]) {
        let out = Command::new(&self.bin)
            .args(args)
            .current_dir(&self.work)
            .env("COSIGN_PASSWORD", "")
            .env("HOME", &self.work)
            .env("TUF_ROOT", self.work.join("tuf"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cosign {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A vLLM cache root (`VLLM_CACHE_ROOT`) as vLLM leaves it: `torch_compile_cache/<hash>/
/// rank_0_0/` with its compiled artifacts.
fn vllm_cache_root(dir: &Path) {
    let rank = dir.join("torch_compile_cache/0f1e2d3c4b/rank_0_0/backbone");
    std::fs::create_dir_all(&rank).unwrap();
    std::fs::write(
        rank.parent().unwrap().join("cache_key_factors.json"),
        br#"{"env": {}, "config_hash": "0f1e2d3c4b"}"#,
    )
    .unwrap();
    std::fs::write(
        rank.join("artifact_compile_range_1_8192"),
        b"compiled graph",
    )
    .unwrap();
}

#[tokio::test]
async fn cache_build_pushes_and_signs_and_verify_gives_the_controllers_verdict() {
    let bin = match crate::kernelcache_verify::cosign() {
        Ok(bin) => bin,
        Err(reason) if std::env::var_os("CI").is_none() => {
            println!("skipping the cache CLI test (outside CI): {reason}");
            return;
        }
        Err(reason) => panic!("the cosign CLI is needed in CI: {reason}"),
    };
    let work = tempfile::tempdir().unwrap();
    let cosign = Cosign {
        bin,
        work: work.path().to_path_buf(),
    };
    cosign.run(&["generate-key-pair"]);
    let key = work.path().join("cosign.key");
    let public = std::fs::read_to_string(work.path().join("cosign.pub")).unwrap();
    let fingerprint = key_fingerprint(&public).unwrap();

    let registry = start_registry("cli-cache").unwrap();
    let addr = registry.addr().to_string();
    let plain = format!("--plain-http-registry={addr}");

    // A Triton cache, signed by `cache build` with the key cosign made.
    let input = data_dir().join("triton-rocm-vector-add/io.triton.cache");
    let image = format!("{addr}/caches/cli-triton:v1");
    let (code, out, err) = kubeairunway(&[
        "cache",
        "build",
        input.to_str().unwrap(),
        &image,
        "--key",
        key.to_str().unwrap(),
        &plain,
        "-o",
        "json",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains(&format!("pushing {image}")), "{err}");
    let built: Value = serde_json::from_str(&out).unwrap();
    let pinned = built["pinned"].as_str().unwrap().to_string();
    assert!(
        pinned.starts_with(&format!("{addr}/caches/cli-triton@sha256:")),
        "{pinned}"
    );
    assert_eq!(built["signer"], fingerprint.as_str());
    assert_eq!(built["labels"]["cache.triton.image/entry-count"], "1");
    assert_eq!(
        built["labels"]["cache.triton.image/summary"],
        r#"{"targets":[{"arch":"gfx90a","backend":"hip","warp_size":64}]}"#
    );
    // The agent's staging of the pushed image gives back the input, byte for byte.
    let puller = Puller::new(RegistryAuth::Anonymous, vec![addr.clone()]);
    let root = tempfile::tempdir().unwrap();
    let staged = puller
        .stage(&pinned, root.path(), "ml", "cli", None, Limits::default())
        .await
        .unwrap();
    assert_eq!(tree(&staged.dir.join("io.triton.cache")), tree(&input));
    // The cosign CLI accepts the signature `cache build` made.
    cosign.run(&[
        "verify",
        "--key",
        "cosign.pub",
        "--insecure-ignore-tlog=true",
        "--allow-insecure-registry",
        "--allow-http-registry",
        &pinned,
    ]);

    // By default `cache build` signs as cosign 3 does: a Sigstore bundle in an OCI
    // artifact listed under the `sha256-<hex>` tag (this registry has no referrers API),
    // and no legacy `.sig`.
    let manifests = kubeairunway_kernelcache_artifact::registry::Client::new(
        RegistryAuth::Anonymous,
        vec![addr.clone()],
        kubeairunway_kernelcache_artifact::registry::Timeouts::default(),
    );
    let tag_of = |pinned: &str, suffix: &str| -> oci_client::Reference {
        let (repo, digest) = pinned.split_once('@').unwrap();
        format!("{repo}:{}{suffix}", digest.replace(':', "-"))
            .parse()
            .unwrap()
    };
    let index = manifests.manifest(&tag_of(&pinned, "")).await.unwrap();
    let index: Value = serde_json::from_slice(&index.bytes).unwrap();
    assert_eq!(
        index["manifests"][0]["artifactType"], "application/vnd.dev.sigstore.bundle.v0.3+json",
        "{index}"
    );
    let legacy_tag = manifests.manifest(&tag_of(&pinned, ".sig")).await;
    assert!(legacy_tag.is_err_and(|e| e.not_found));

    // With `--signature-format legacy`: cosign's simple-signing object, which the
    // controller's verifier and the cosign CLI accept too.
    let legacy_image = format!("{addr}/caches/cli-triton-legacy:v1");
    let (code, out, err) = kubeairunway(&[
        "cache",
        "build",
        input.to_str().unwrap(),
        &legacy_image,
        "--key",
        key.to_str().unwrap(),
        "--signature-format",
        "legacy",
        &plain,
        "-o",
        "json",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let legacy: Value = serde_json::from_str(&out).unwrap();
    let legacy_pinned = legacy["pinned"].as_str().unwrap().to_string();
    assert_eq!(legacy["signer"], fingerprint.as_str());
    assert!(
        manifests
            .manifest(&tag_of(&legacy_pinned, ".sig"))
            .await
            .is_ok()
    );
    let no_bundle = manifests.manifest(&tag_of(&legacy_pinned, "")).await;
    assert!(no_bundle.is_err_and(|e| e.not_found));
    cosign.run(&[
        "verify",
        "--key",
        "cosign.pub",
        "--insecure-ignore-tlog=true",
        "--allow-insecure-registry",
        "--allow-http-registry",
        &legacy_pinned,
    ]);

    // `cache verify` under a policy file, from the tag.
    let policy_file = work.path().join("policy.yaml");
    let policy = |keys: Vec<String>| {
        let mut p = KernelCachePolicy::new(
            "default",
            KernelCachePolicySpec {
                mode: VerificationMode::Key,
                public_keys: keys,
                ..Default::default()
            },
        );
        p.metadata.name = Some("default".into());
        p
    };
    std::fs::write(
        &policy_file,
        serde_saphyr::to_string(&policy(vec![public.clone()])).unwrap(),
    )
    .unwrap();
    let verify = |image: String, extra: Vec<String>| {
        let plain = plain.clone();
        async move {
            let mut args = vec!["cache".to_string(), "verify".into(), image, plain];
            args.extend(extra);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kubeairunway(&args).await
        }
    };
    let with_file = || {
        vec![
            "--policy-file".to_string(),
            policy_file.display().to_string(),
        ]
    };
    let (code, out, err) = verify(image.clone(), with_file()).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("Pinned:   {pinned}\n")), "{out}");
    assert!(out.contains("(mode key)"), "{out}");
    assert!(
        out.contains(&format!(
            "Verified: True Verified: signed by {fingerprint}\n"
        )),
        "{out}"
    );
    let (code, out, err) = verify(legacy_image.clone(), with_file()).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!(
            "Verified: True Verified: signed by {fingerprint}\n"
        )),
        "{out}"
    );

    // A vLLM cache, unsigned: refused; then signed by the cosign CLI in its default
    // format of the day (a Sigstore bundle): verified.
    let vllm = tempfile::tempdir().unwrap();
    vllm_cache_root(vllm.path());
    let vllm_image = format!("{addr}/caches/cli-vllm:v1");
    let vllm_dir = vllm.path().to_str().unwrap();
    let (code, _, err) = kubeairunway(&[
        "cache",
        "build",
        vllm_dir,
        &vllm_image,
        "--type",
        "vllm",
        &plain,
    ])
    .await;
    assert_eq!(code, 1);
    assert!(
        err.contains("a vLLM cache does not record its GPU: give the targets (e.g. cuda:90)"),
        "{err}"
    );
    let (code, out, err) = kubeairunway(&[
        "cache",
        "build",
        vllm_dir,
        &vllm_image,
        "--type",
        "vllm",
        "--target",
        "cuda:sm_90",
        &plain,
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            r#"  cache.vllm.image/summary: {"targets":[{"arch":"90","backend":"cuda","warp_size":32}]}"#
        ),
        "{out}"
    );
    assert!(out.contains("not signed"), "{out}");
    let vllm_pinned = out
        .lines()
        .find_map(|l| l.strip_prefix("pushed "))
        .unwrap()
        .to_string();
    let (code, out, _) = verify(vllm_image.clone(), with_file()).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "Verified: False VerificationFailed: no signature found for {vllm_pinned}"
        )),
        "{out}"
    );
    cosign.run(&[
        "sign",
        "--key",
        "cosign.key",
        "--use-signing-config=false",
        "--tlog-upload=false",
        "--allow-insecure-registry",
        "--allow-http-registry",
        "--yes",
        &vllm_pinned,
    ]);
    let (code, out, err) = verify(vllm_image.clone(), with_file()).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!(
            "Verified: True Verified: signed by {fingerprint}\n"
        )),
        "{out}"
    );

    // Under the cluster's policy: none, then one that trusts another key, then ours.
    let cluster = kubeairunway_e2e::private_cluster("cli-cache")
        .await
        .unwrap();
    let kc = cluster.kubeconfig().display().to_string();
    let on_cluster = || vec!["--kubeconfig".to_string(), kc.clone()];
    let (code, _, err) = verify(image.clone(), on_cluster()).await;
    assert_eq!(code, 1);
    assert!(
        err.contains("this cluster has no KernelCachePolicy CRD (kernelcachepolicies.cache.kubeairunway.ai): the kernel-cache provider is not installed"),
        "{err}"
    );
    let client = cluster.client().await.unwrap();
    crds::install(&client, &kubeairunway_config::kernelcache_crds())
        .await
        .unwrap();
    let (code, out, _) = verify(image.clone(), on_cluster()).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("Verified: False NoPolicy: no KernelCachePolicy 'default'\n"),
        "{out}"
    );
    let policies: Api<KernelCachePolicy> = Api::all(client);
    let (other, _) = {
        let signer = sigstore::crypto::SigningScheme::ECDSA_P256_SHA256_ASN1
            .create_signer()
            .unwrap();
        let pem = signer
            .to_sigstore_keypair()
            .unwrap()
            .public_key_to_pem()
            .unwrap();
        (pem, signer)
    };
    policies
        .create(&PostParams::default(), &policy(vec![other]))
        .await
        .unwrap();
    let (code, out, _) = verify(image.clone(), on_cluster()).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("Policy:   KernelCachePolicy/default (mode key)\n"),
        "{out}"
    );
    assert!(
        out.contains("Verified: False VerificationFailed: unsatisfied constraints: no signature by a trusted key"),
        "{out}"
    );
    let mut trusted = policies.get("default").await.unwrap();
    trusted.spec.public_keys = vec![public];
    policies
        .replace("default", &PostParams::default(), &trusted)
        .await
        .unwrap();
    let (code, out, err) = verify(vllm_image, on_cluster()).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!(
            "Verified: True Verified: signed by {fingerprint}\n"
        )),
        "{out}"
    );
}
