//! `deployment-provider`: serves ModelDeployments whose provider is `deployment` with a
//! plain Deployment and Service.

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kubeairunway_sdk::runtime::main_with::<kubeairunway_deployment_provider::cli::Flags>(
        "deployment-provider",
    )
    .await
}
