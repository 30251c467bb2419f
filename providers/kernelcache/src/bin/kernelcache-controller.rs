//! `kernelcache-controller`: pins and verifies KernelCache images, adds up the node
//! agents' reports, and writes `KernelCacheReady` on ModelDeployments. See
//! `kubeairunway_kernelcache::controller`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kubeairunway_kernelcache::controller::app::main().await
}
