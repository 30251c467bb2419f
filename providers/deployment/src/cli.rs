//! The flags of `deployment-provider` (each also an environment variable): [`Flags`], its
//! own, which the `kubeairunway` CLI flattens into its commands to run the same provider,
//! and [`Cli`], the binary's (with the SDK runtime's), which the chart tests parse the
//! chart's arguments with.

use kubeairunway_sdk::runtime::ProviderFlags;

use crate::{
    DEFAULT_LLAMACPP_GPU_IMAGE, DEFAULT_LLAMACPP_IMAGE, DEFAULT_VLLM_IMAGE, DeploymentProvider,
    Images, NAME,
};

/// The Deployment provider's own flags.
#[derive(Clone, Debug, clap::Args)]
#[group(id = "DeploymentProviderFlags")]
#[command(next_help_heading = "Deployment provider")]
pub struct Flags {
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

impl Default for Flags {
    fn default() -> Self {
        Self {
            vllm_image: DEFAULT_VLLM_IMAGE.to_string(),
            sglang_image: String::new(),
            llamacpp_image: DEFAULT_LLAMACPP_IMAGE.to_string(),
            llamacpp_gpu_image: DEFAULT_LLAMACPP_GPU_IMAGE.to_string(),
        }
    }
}

impl Flags {
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

/// The binary's command line: the SDK runtime's flags and [`Flags`] (the chart tests
/// parse the chart's arguments with it).
pub type Cli = kubeairunway_sdk::runtime::Cli<Flags>;

impl ProviderFlags for Flags {
    type Provider = DeploymentProvider;
    const ABOUT: &'static str = "Serves ModelDeployments whose provider is `deployment` with a plain Deployment and Service.";

    async fn provider_for(
        &self,
        _: &kubeairunway_sdk::kube::Client,
    ) -> anyhow::Result<DeploymentProvider> {
        Ok(self.provider())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_providers_defaults() {
        let cli = <Cli as clap::Parser>::try_parse_from(["deployment-provider"]).unwrap();
        let p = cli.flags.provider();
        assert_eq!(p.name, NAME);
        assert_eq!(p.images, Images::default());
        assert_eq!(
            format!("{:?}", cli.flags),
            format!("{:?}", Flags::default())
        );
        let cli = <Cli as clap::Parser>::try_parse_from([
            "deployment-provider",
            "--sglang-image=lmsysorg/sglang:v0.5.5",
            "--vllm-image=",
        ])
        .unwrap();
        let images = cli.flags.provider().images;
        assert_eq!(images.sglang.as_deref(), Some("lmsysorg/sglang:v0.5.5"));
        assert_eq!(images.vllm, None, "empty: spec.image required");
    }
}
