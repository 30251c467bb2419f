//! `kaito-provider`: serves ModelDeployments with KAITO.

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kubeairunway_sdk::runtime::main_with::<kubeairunway_kaito_provider::cli::Flags>(
        "kaito-provider",
    )
    .await
}
