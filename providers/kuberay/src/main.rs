//! `kuberay-provider`: serves ModelDeployments whose provider is `kuberay` as KubeRay
//! RayServices.

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kubeairunway_sdk::runtime::main_with::<kubeairunway_kuberay_provider::cli::Flags>(
        "kuberay-provider",
    )
    .await
}
