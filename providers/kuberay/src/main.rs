//! `kuberay-provider`: serves ModelDeployments whose provider is `kuberay` as KubeRay
//! RayServices.

use clap::Parser;
use kubeairunway_kuberay_provider::{DEFAULT_RAY_IMAGE, DEFAULT_RAY_VERSION, KubeRayProvider};

#[derive(Debug, Parser)]
#[command(name = "kuberay-provider", version, about)]
struct Cli {
    #[command(flatten)]
    options: kubeairunway_sdk::runtime::Options,
    /// Ray version: the tag of the Ray LLM image (up to its first `-`, the cluster's
    /// rayVersion).
    #[arg(long, env = "RAY_VERSION", default_value = DEFAULT_RAY_VERSION)]
    ray_version: String,
    /// Repository of the Ray LLM image, used unless a ModelDeployment sets spec.image.
    #[arg(long, env = "RAY_IMAGE", default_value = DEFAULT_RAY_IMAGE)]
    ray_image: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt =
        kubeairunway_sdk::process::Runtime::start("kuberay-provider", cli.options.process.clone())
            .await?;
    let provider = KubeRayProvider::new(cli.ray_image, cli.ray_version);
    kubeairunway_sdk::runtime::run(provider, rt, cli.options).await
}
