//! `kernelcache-agent`: the kernel-cache node agent (a DaemonSet on GPU nodes). See
//! `kubeairunway_kernelcache::agent`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kubeairunway_kernelcache::agent::app::main().await
}
