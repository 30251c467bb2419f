//! The flags of `deployment-provider` (each also an environment variable), here so that
//! the chart tests parse the chart's arguments with them.

use clap::Parser;

use crate::{
    DEFAULT_LLAMACPP_GPU_IMAGE, DEFAULT_LLAMACPP_IMAGE, DEFAULT_VLLM_IMAGE, DeploymentProvider,
    Images, NAME,
};

/// Flags of `deployment-provider`.
#[derive(Debug, Parser)]
#[command(name = "deployment-provider", version, about)]
pub struct Cli {
    /// The SDK runtime's flags.
    #[command(flatten)]
    pub options: kubeairunway_sdk::runtime::Options,
    /// The vLLM image unless a ModelDeployment sets spec.image.
    #[arg(long, env = "VLLM_IMAGE", default_value = DEFAULT_VLLM_IMAGE)]
    pub vllm_image: String,
    /// The SGLang image unless a ModelDeployment sets spec.image; empty: spec.image is
    /// required for SGLang.
    #[arg(long, env = "SGLANG_IMAGE", default_value = "")]
    pub sglang_image: String,
    /// The llama.cpp server image of CPU-only replicas unless spec.image is set.
    #[arg(long, env = "LLAMACPP_IMAGE", default_value = DEFAULT_LLAMACPP_IMAGE)]
    pub llamacpp_image: String,
    /// The llama.cpp server image of replicas with GPUs unless spec.image is set.
    #[arg(long, env = "LLAMACPP_GPU_IMAGE", default_value = DEFAULT_LLAMACPP_GPU_IMAGE)]
    pub llamacpp_gpu_image: String,
}

impl Cli {
    /// The provider these flags configure.
    pub fn provider(&self) -> DeploymentProvider {
        DeploymentProvider {
            name: NAME.into(),
            images: Images::new(
                &self.vllm_image,
                &self.sglang_image,
                &self.llamacpp_image,
                &self.llamacpp_gpu_image,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_providers_defaults() {
        let cli = Cli::try_parse_from(["deployment-provider"]).unwrap();
        let p = cli.provider();
        assert_eq!(p.name, NAME);
        assert_eq!(p.images, Images::default());
        let cli = Cli::try_parse_from([
            "deployment-provider",
            "--sglang-image=lmsysorg/sglang:v0.5.5",
            "--vllm-image=",
        ])
        .unwrap();
        let images = cli.provider().images;
        assert_eq!(images.sglang.as_deref(), Some("lmsysorg/sglang:v0.5.5"));
        assert_eq!(images.vllm, None, "empty: spec.image required");
    }
}
