//! `kernelcache-warmup`: warms nodes before models run there (Warmups, and `spec.warmup`
//! of ModelDeployments). See `kubeairunway_kernelcache::warmup`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kubeairunway_kernelcache::warmup::app::main().await
}
