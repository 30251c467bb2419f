//! `kernelcache-warmup`: warms nodes before models run there (Warmups, and `spec.warmup`
//! of ModelDeployments). See `kubeairunway_kernelcache_warmup`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kubeairunway_kernelcache_warmup::app::main().await
}
