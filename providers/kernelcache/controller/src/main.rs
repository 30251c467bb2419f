//! `kernelcache-controller`: pins and verifies KernelCache images, adds up the node
//! agents' reports, and writes `KernelCacheReady` on ModelDeployments. See
//! `kubeairunway_kernelcache_controller`.

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kubeairunway_kernelcache_controller::app::main().await
}
