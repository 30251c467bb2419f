//! The flags of `kuberay-provider` (each also an environment variable), here so that the
//! chart tests parse the chart's arguments with them.

use clap::Parser;

use crate::{DEFAULT_RAY_IMAGE, DEFAULT_RAY_VERSION, KubeRayProvider};

/// Flags of `kuberay-provider`.
#[derive(Debug, Parser)]
#[command(name = "kuberay-provider", version, about)]
pub struct Cli {
    /// The SDK runtime's flags.
    #[command(flatten)]
    pub options: kubeairunway_sdk::runtime::Options,
    /// Ray version: the tag of the Ray LLM image (up to its first `-`, the cluster's
    /// rayVersion).
    #[arg(long, env = "RAY_VERSION", default_value = DEFAULT_RAY_VERSION)]
    pub ray_version: String,
    /// Repository of the Ray LLM image, used unless a ModelDeployment sets spec.image.
    #[arg(long, env = "RAY_IMAGE", default_value = DEFAULT_RAY_IMAGE)]
    pub ray_image: String,
}

impl Cli {
    /// The provider these flags configure.
    pub fn provider(&self) -> KubeRayProvider {
        KubeRayProvider::new(self.ray_image.clone(), self.ray_version.clone())
    }
}
