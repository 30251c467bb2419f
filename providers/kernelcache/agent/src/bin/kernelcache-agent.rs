//! `kernelcache-agent`: the kernel-cache node agent (a DaemonSet on GPU nodes). See
//! `kubeairunway_kernelcache_agent`.

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kubeairunway_kernelcache_agent::app::main().await
}
