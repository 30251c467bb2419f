//! The kernel-cache CRDs on the real API server: accepted, the verification policy's CEL
//! rules enforced, and a node agent's status written by server-side apply.

use kube::api::{Api, Patch, PatchParams};
use kubeairunway_kernelcache::api::{CacheState, KernelCacheNode, KernelCachePolicy};
use serde_json::json;

async fn client() -> kube::Client {
    let (_, client) = kubeairunway_e2e::core_cluster().await.unwrap();
    kubeairunway_testcluster::install_crds(&client, &kubeairunway_kernelcache::api::crds())
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
