//! The flags of `kuberay-provider` (each also an environment variable): [`Flags`], its
//! own, which the `kubeairunway` CLI flattens into its commands to run the same provider,
//! and [`Cli`], the binary's (with the SDK runtime's), which the chart tests parse the
//! chart's arguments with.

use kubeairunway_sdk::runtime::ProviderFlags;

use crate::settings::{DEFAULT_RAY_IMAGE, DEFAULT_RAY_VERSION, KubeRayProvider};

/// The KubeRay provider's own flags.
#[derive(Clone, Debug, clap::Args)]
#[group(id = "KubeRayProviderFlags")]
#[command(next_help_heading = "KubeRay provider")]
pub struct Flags {
    /// Ray version: the tag of the Ray LLM image (up to its first `-`, the cluster's
    /// rayVersion).
    #[arg(long, env = "RAY_VERSION", default_value = DEFAULT_RAY_VERSION)]
    pub ray_version: String,
    /// Repository of the Ray LLM image, used unless a ModelDeployment sets spec.image.
    #[arg(long, env = "RAY_IMAGE", default_value = DEFAULT_RAY_IMAGE)]
    pub ray_image: String,
}

impl Default for Flags {
    fn default() -> Self {
        Self {
            ray_version: DEFAULT_RAY_VERSION.to_string(),
            ray_image: DEFAULT_RAY_IMAGE.to_string(),
        }
    }
}

impl Flags {
    /// The provider these flags configure.
    pub fn provider(&self) -> KubeRayProvider {
        KubeRayProvider::new(self.ray_image.clone(), self.ray_version.clone())
    }
}

/// The binary's command line: the SDK runtime's flags and [`Flags`] (the chart tests
/// parse the chart's arguments with it).
pub type Cli = kubeairunway_sdk::runtime::Cli<Flags>;

impl ProviderFlags for Flags {
    type Provider = KubeRayProvider;
    const ABOUT: &'static str =
        "Serves ModelDeployments whose provider is `kuberay` as KubeRay RayServices.";

    async fn provider_for(&self, _: &kube::Client) -> anyhow::Result<KubeRayProvider> {
        Ok(self.provider())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_the_flags_defaults() {
        let cli = <Cli as clap::Parser>::try_parse_from(["kuberay-provider"]).unwrap();
        assert_eq!(
            format!("{:?}", cli.flags),
            format!("{:?}", Flags::default())
        );
    }
}
