//! The kernel-cache CRDs on the real API server: accepted, the verification policy's CEL
//! rules enforced, and a node agent's status written by server-side apply.

use kube::api::{Api, Patch, PatchParams};
use kubeairunway_kernelcache_api::{CacheState, KernelCacheNode, KernelCachePolicy};
use serde_json::json;

async fn client() -> kube::Client {
    let (_, client) = kubeairunway_e2e::core_cluster().await.unwrap();
    kubeairunway_testcluster::install_crds(&client, &kubeairunway_kernelcache_api::crds())
        .await
        .unwrap();
    client
}

#[tokio::test]
async fn verification_policy_rules_are_enforced_by_the_api_server() {
    let client = client().await;
    let api: Api<KernelCachePolicy> = Api::all(client);
    let pp = PatchParams::apply("tests").force();
    let policy = |name: &str, spec: serde_json::Value| json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCachePolicy", "metadata": {"name": name}, "spec": spec});
    for (name, spec, message) in [
        (
            "kc-no-keys",
            json!({"mode": "key"}),
            "mode key needs publicKeys",
        ),
        (
            "kc-no-identity",
            json!({"mode": "keyless"}),
            "mode keyless needs keyless.issuer, keyless.subject and trustRoot",
        ),
        (
            "kc-no-ca",
            json!({"mode": "certificate"}),
            "mode certificate needs certificate.caBundle and certificate.subjectPattern",
        ),
    ] {
        let err = api
            .patch(name, &pp, &Patch::Apply(policy(name, spec)))
            .await
            .unwrap_err();
        assert!(err.to_string().contains(message), "{name}: {err}");
    }
    let ok = policy(
        "kc-keys",
        json!({"mode": "key", "publicKeys": ["-----BEGIN PUBLIC KEY-----\n...\n-----END PUBLIC KEY-----"]}),
    );
    api.patch("kc-keys", &pp, &Patch::Apply(ok)).await.unwrap();
    let disabled = policy("kc-disabled", json!({"mode": "disabled"}));
    api.patch("kc-disabled", &pp, &Patch::Apply(disabled))
        .await
        .unwrap();
}

#[tokio::test]
async fn node_status_round_trips() {
    let client = client().await;
    let api: Api<KernelCacheNode> = Api::all(client);
    let name = format!("node-{}", std::process::id());
    let node = json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCacheNode", "metadata": {"name": name}, "spec": {"nodeName": name}});
    api.patch(
        &name,
        &PatchParams::apply("kernelcache-agent").force(),
        &Patch::Apply(node),
    )
    .await
    .unwrap();
    let status = json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCacheNode", "status": {
        "gpuCount": 2,
        "gpus": [
            {"index": 0, "name": "NVIDIA H100 80GB HBM3", "backend": "cuda", "arch": "90", "warpSize": 32},
            {"index": 1, "name": "AMD Instinct MI210", "backend": "hip", "arch": "gfx90a", "warpSize": 64},
        ],
        "caches": [{
            "namespace": "ml", "name": "vadd", "digest": "sha256:8ce4", "state": "Ready",
            "compatibleGpus": [1],
            "incompatibleGpus": [{"index": 0, "reason": "BackendMismatch", "message": "cache built for hip; GPU 0 (NVIDIA H100 80GB HBM3) is cuda"}],
            "sizeBytes": 80415,
        }],
    }});
    api.patch_status(
        &name,
        &PatchParams::apply("kernelcache-agent").force(),
        &Patch::Apply(status),
    )
    .await
    .unwrap();
    let back = api.get(&name).await.unwrap().status.unwrap();
    assert_eq!(back.gpu_count, 2);
    assert_eq!(back.caches[0].state, CacheState::Ready);
    assert_eq!(
        back.caches[0].incompatible_gpus[0].reason,
        "BackendMismatch"
    );
}

/// Pulling and staging cache images from a real OCI registry on loopback.
mod oci {
    use std::path::{Path, PathBuf};

    use flate2::Compression;
    use flate2::write::GzEncoder;
    use kubeairunway_kernelcache_artifact::extract::Limits;
    use kubeairunway_kernelcache_artifact::image::CacheType;
    use kubeairunway_kernelcache_artifact::oci::{PullError, pin};
    use kubeairunway_testcluster::registry::Registry;
    use serde_json::{Value, json};

    use kubeairunway_e2e::cache_images::{
        self, CacheImage, ROCM_HASH as HASH, puller, start_registry, triton_rocm,
    };

    async fn push(registry: &Registry, repo_tag: &str, image: CacheImage) -> String {
        cache_images::push(registry, repo_tag, &image)
            .await
            .unwrap()
    }

    fn with_labels(image: CacheImage, labels: &Value) -> CacheImage {
        CacheImage {
            config: cache_images::config(labels),
            ..image
        }
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut out: Vec<String> = walk(dir)
            .into_iter()
            .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
            .collect();
        out.sort();
        out
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            out.push(e.path());
            if e.file_type().unwrap().is_dir() {
                out.extend(walk(&e.path()));
            }
        }
        out
    }

    #[tokio::test]
    async fn a_pinned_triton_cache_is_pulled_verified_and_staged() {
        let registry = start_registry("stage").unwrap();
        let image = push(&registry, "caches/vadd:rocm", triton_rocm(&[]).unwrap()).await;
        let puller = puller(&registry);
        let digest = puller.resolve(&image).await.unwrap();
        assert!(digest.starts_with("sha256:"));
        let pinned = pin(&image, &digest).unwrap();

        // Tags are never pulled.
        let root = tempfile::tempdir().unwrap();
        assert!(matches!(
            puller
                .stage(&image, root.path(), "ml", "vadd", None, Limits::default())
                .await,
            Err(PullError::NotPinned(_))
        ));

        let mount = "/var/cache/kubeairunway/kernels/vadd";
        let staged = puller
            .stage(
                &pinned,
                root.path(),
                "ml",
                "vadd",
                Some(mount),
                Limits::default(),
            )
            .await
            .unwrap();
        assert_eq!(staged.image.cache_type, CacheType::Triton);
        assert_eq!(staged.image.targets[0].arch, "gfx90a");
        assert_eq!(
            staged.dir,
            root.path().join("ml/vadd").join(digest.replace(':', "-"))
        );
        let group: Value = serde_json::from_slice(
            &std::fs::read(
                staged
                    .dir
                    .join("io.triton.cache")
                    .join(HASH)
                    .join("__grp__add_kernel.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            group["child_paths"]["add_kernel.json"],
            format!("{mount}/{HASH}/add_kernel.json")
        );
        // Staging again (an agent restart) redoes nothing.
        let again = puller
            .stage(
                &pinned,
                root.path(),
                "ml",
                "vadd",
                Some(mount),
                Limits::default(),
            )
            .await
            .unwrap();
        assert!(again.extracted.already_present);

        // The tag moves: the pin notices, and the pinned digest still stages what it was.
        push(
            &registry,
            "caches/vadd:rocm",
            triton_rocm(&[("io.triton.cache/extra.txt", b"new")]).unwrap(),
        )
        .await;
        let moved = puller.check_pin(&image, &digest).await.unwrap_err();
        assert!(
            matches!(&moved, PullError::TagMoved { pinned, .. } if pinned == &digest),
            "{moved}"
        );
        let other_root = tempfile::tempdir().unwrap();
        let old = puller
            .stage(
                &pinned,
                other_root.path(),
                "ml",
                "vadd",
                None,
                Limits::default(),
            )
            .await
            .unwrap();
        assert!(!old.dir.join("io.triton.cache/extra.txt").exists());
    }

    #[tokio::test]
    async fn tampered_and_malformed_images_are_refused_with_nothing_written() {
        let registry = start_registry("refuse").unwrap();
        let puller = puller(&registry);
        let refuse = |root: &tempfile::TempDir| {
            let left: Vec<String> = listing(root.path())
                .into_iter()
                .filter(|p| p != ".downloads")
                .collect();
            assert!(left.is_empty(), "left behind: {left:?}");
        };

        // A corrupted blob: the registry serves bytes that do not match the layer digest.
        let corrupt = triton_rocm(&[]).unwrap();
        let layer = corrupt.layer.clone();
        let image = push(&registry, "caches/corrupt:1", corrupt).await;
        let pinned = pin(&image, &puller.resolve(&image).await.unwrap()).unwrap();
        let layer_digest = format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(&layer));
        let stored = walk(&registry.storage())
            .into_iter()
            .find(|p| p.ends_with(Path::new(&layer_digest).join("data")))
            .unwrap();
        let mut bytes = std::fs::read(&stored).unwrap();
        let last = bytes.len() - 20;
        bytes[last] ^= 0xff;
        std::fs::write(&stored, bytes).unwrap();
        let root = tempfile::tempdir().unwrap();
        let err = puller
            .stage(
                &pinned,
                root.path(),
                "ml",
                "corrupt",
                None,
                Limits::default(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, PullError::Registry(ref m) if m.message.to_lowercase().contains("digest")),
            "{err}"
        );
        refuse(&root);

        // Not a kernel cache: no cache labels.
        let image = push(
            &registry,
            "caches/plain:1",
            with_labels(triton_rocm(&[]).unwrap(), &json!({"maintainer": "x"})),
        )
        .await;
        let pinned = pin(&image, &puller.resolve(&image).await.unwrap()).unwrap();
        let root = tempfile::tempdir().unwrap();
        let err = puller
            .stage(&pinned, root.path(), "ml", "plain", None, Limits::default())
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "not a kernel cache image: no cache.triton.image/summary or cache.vllm.image/summary label"
        );
        refuse(&root);

        // A layer that climbs out of the cache.
        let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
        let mut header = tar::Header::new_gnu();
        header.as_old_mut().name[..14].copy_from_slice(b"../../escape.x");
        header.set_size(1);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append(&header, &b"x"[..]).unwrap();
        let evil = builder.into_inner().unwrap().finish().unwrap();
        let image = push(
            &registry,
            "caches/evil:1",
            CacheImage {
                layer: evil,
                ..triton_rocm(&[]).unwrap()
            },
        )
        .await;
        let pinned = pin(&image, &puller.resolve(&image).await.unwrap()).unwrap();
        let root = tempfile::tempdir().unwrap();
        let err = puller
            .stage(&pinned, root.path(), "ml", "evil", None, Limits::default())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("contains '..'"), "{err}");
        refuse(&root);
        assert!(!root.path().parent().unwrap().join("escape.x").exists());

        // Over the size cap: refused from the manifest, before downloading.
        let image = push(&registry, "caches/big:1", triton_rocm(&[]).unwrap()).await;
        let pinned = pin(&image, &puller.resolve(&image).await.unwrap()).unwrap();
        let root = tempfile::tempdir().unwrap();
        let err = puller
            .stage(
                &pinned,
                root.path(),
                "ml",
                "big",
                None,
                Limits {
                    max_bytes: 100,
                    max_entries: 10,
                },
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("exceeds 100 bytes"), "{err}");
        refuse(&root);
    }
}

/// `cache build`'s library: a Triton cache directory packaged, pushed, signed with a key,
/// verified, and staged by the agent's puller: identical to the input, file for file,
/// with the Triton rewrite left out.
mod build {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    use kubeairunway_e2e::cache_images::{data_dir, new_signer, start_registry};
    use kubeairunway_kernelcache_api::{KernelCachePolicySpec, VerificationMode};
    use kubeairunway_kernelcache_artifact::extract::Limits;
    use kubeairunway_kernelcache_artifact::image::CacheType;
    use kubeairunway_kernelcache_artifact::oci::Puller;
    use kubeairunway_kernelcache_signing::build::{package, push};
    use kubeairunway_kernelcache_signing::sign::{Format, sign};
    use kubeairunway_kernelcache_signing::verify::verify;
    use oci_client::secrets::RegistryAuth;

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

    #[tokio::test]
    async fn a_built_cache_is_signed_verified_and_staged_identical_to_its_input() {
        let registry = start_registry("build").unwrap();
        let plain = vec![registry.addr().to_string()];
        let input = data_dir().join("triton-rocm-vector-add/io.triton.cache");
        let built = package(&input, CacheType::Triton, &[]).unwrap();
        let image = format!("{}/caches/built:v1", registry.addr());
        let pinned = push(&built, &image, &RegistryAuth::Anonymous, plain.clone())
            .await
            .unwrap();
        let (signer, public) = new_signer().unwrap();
        let key = signer
            .to_sigstore_keypair()
            .unwrap()
            .private_key_to_pem()
            .unwrap();
        sign(
            &pinned,
            key.as_bytes(),
            b"",
            &RegistryAuth::Anonymous,
            plain.clone(),
            Format::Bundle,
        )
        .await
        .unwrap();
        let policy = KernelCachePolicySpec {
            mode: VerificationMode::Key,
            public_keys: vec![public],
            ..Default::default()
        };
        let v = verify(&policy, &pinned, &RegistryAuth::Anonymous, plain.clone())
            .await
            .unwrap();
        assert!(v.verified, "{v:?}");
        // The legacy format verifies too (the same image in another repository).
        let legacy = push(
            &built,
            &format!("{}/caches/built-legacy:v1", registry.addr()),
            &RegistryAuth::Anonymous,
            plain.clone(),
        )
        .await
        .unwrap();
        let unsigned = verify(&policy, &legacy, &RegistryAuth::Anonymous, plain.clone()).await;
        assert!(unsigned.is_err(), "{unsigned:?}");
        sign(
            &legacy,
            key.as_bytes(),
            b"",
            &RegistryAuth::Anonymous,
            plain.clone(),
            Format::Legacy,
        )
        .await
        .unwrap();
        let v = verify(&policy, &legacy, &RegistryAuth::Anonymous, plain.clone())
            .await
            .unwrap();
        assert!(v.verified, "{v:?}");
        // What `cache verify` says, from the tag.
        let explained = kubeairunway_kernelcache_signing::verify::explain(
            &policy,
            &image,
            &RegistryAuth::Anonymous,
            plain.clone(),
        )
        .await
        .unwrap();
        assert_eq!(explained.pinned, pinned);
        assert!(explained.verification.verified, "{explained:?}");
        assert!(explained.image.is_some(), "a cache image");
        let unsigned_policy = KernelCachePolicySpec {
            public_keys: vec![new_signer().unwrap().1],
            ..policy.clone()
        };
        let refused = kubeairunway_kernelcache_signing::verify::explain(
            &unsigned_policy,
            &image,
            &RegistryAuth::Anonymous,
            plain.clone(),
        )
        .await
        .unwrap()
        .verification;
        assert!(!refused.verified);
        assert!(
            refused
                .message
                .as_deref()
                .unwrap_or_default()
                .contains("unsatisfied constraints"),
            "{refused:?}"
        );

        let puller = Puller::new(RegistryAuth::Anonymous, plain);
        let root = tempfile::tempdir().unwrap();
        let staged = puller
            .stage(&pinned, root.path(), "ml", "built", None, Limits::default())
            .await
            .unwrap();
        assert_eq!(staged.image.targets[0].arch, "gfx90a");
        assert_eq!(tree(&staged.dir.join("io.triton.cache")), tree(&input));
        // With the rewrite, only the group file differs.
        let other = tempfile::tempdir().unwrap();
        let rewritten = puller
            .stage(
                &pinned,
                other.path(),
                "ml",
                "built",
                Some("/m"),
                Limits::default(),
            )
            .await
            .unwrap();
        let (a, b) = (tree(&rewritten.dir.join("io.triton.cache")), tree(&input));
        let differ: Vec<&PathBuf> = a.keys().filter(|k| a[*k] != b[*k]).collect();
        assert_eq!(differ.len(), 1);
        assert!(
            differ[0].to_string_lossy().contains("__grp__"),
            "{differ:?}"
        );
    }
}
