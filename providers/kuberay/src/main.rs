//! `kuberay-provider`: serves ModelDeployments whose provider is `kuberay` as KubeRay
//! RayServices.

use clap::Parser;
use kubeairunway_kuberay_provider::KubeRayProvider;
use kubeairunway_kuberay_provider::cli::Cli;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt =
        kubeairunway_sdk::process::Runtime::start("kuberay-provider", cli.options.process.clone())
            .await?;
    let provider = KubeRayProvider::new(cli.ray_image, cli.ray_version);
    kubeairunway_sdk::runtime::run(provider, rt, cli.options).await
}
