//! `kernelcache-webhook`: the mutating admission webhook that gives serving pods their
//! staged kernel cache. See `kubeairunway_kernelcache::webhook`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kubeairunway_kernelcache::webhook::app::main().await
}
