//! The real upstream CRDs (KAITO, Dynamo, KubeRay, in every version we support, and the
//! Gateway API and its Inference Extension the gateway uses) are accepted by the API
//! server. Same-named versions replace each other, so this test runs
//! its own cluster instead of the shared one.

use kubeairunway_e2e::upstream_crds;
use kubeairunway_testcluster::{Lifetime, TestCluster, cache_dir, install_crds};

#[tokio::test]
async fn upstream_crds_are_accepted_and_established() {
    let dir = cache_dir()
        .join("runs")
        .join(format!("{}-upstream", std::process::id()));
    let cluster =
        tokio::task::spawn_blocking(move || TestCluster::start(&dir, Lifetime::TiedToProcess))
            .await
            .unwrap()
            .unwrap();
    let client = cluster.client().await.unwrap();
    let crds = upstream_crds().unwrap();
    assert_eq!(crds.len(), 13);
    for (file, crd) in crds {
        install_crds(&client, std::slice::from_ref(&crd))
            .await
            .unwrap_or_else(|e| panic!("{file}: {e:#}"));
    }
}
