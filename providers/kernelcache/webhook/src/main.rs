//! `kernelcache-webhook`: the mutating admission webhook that gives serving pods their
//! staged kernel cache. See `kubeairunway_kernelcache_webhook`.

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kubeairunway_kernelcache_webhook::app::main().await
}
