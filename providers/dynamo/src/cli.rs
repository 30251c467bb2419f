//! The flags of `dynamo-provider` (each also an environment variable): [`Flags`], its own,
//! which the `kubeairunway` CLI flattens into its commands to run the same provider, and
//! [`Cli`], the binary's (with the SDK runtime's), which the chart tests parse the chart's
//! arguments with.

use std::time::Duration;

use kubeairunway_sdk::runtime::ProviderFlags;

use crate::{DEFAULT_DYNAMO_VERSION, Dynamo, Settings};

/// The Dynamo provider's own flags.
#[derive(Clone, Debug, clap::Args)]
#[group(id = "DynamoProviderFlags")]
#[command(next_help_heading = "Dynamo provider")]
pub struct Flags {
    /// Tag of the `nvcr.io/nvidia/ai-dynamo/{vllm,sglang,tensorrtllm}-runtime` images.
    #[arg(long, env = "DYNAMO_VERSION", default_value = DEFAULT_DYNAMO_VERSION)]
    pub dynamo_version: String,
    /// How long Dynamo's `failed` state must last before the ModelDeployment is Failed.
    #[arg(long, env = "FAILED_THRESHOLD", default_value = "5m", value_parser = kubeairunway_sdk::process::parse_duration)]
    pub failed_threshold: Duration,
}

impl Default for Flags {
    fn default() -> Self {
        let settings = Settings::default();
        Self {
            dynamo_version: settings.dynamo_version,
            failed_threshold: settings.failed_after,
        }
    }
}

impl Flags {
    /// The provider these flags configure.
    pub fn provider(&self) -> Dynamo {
        Dynamo::new(Settings {
            dynamo_version: self.dynamo_version.clone(),
            failed_after: self.failed_threshold,
        })
    }
}

/// The binary's command line: the SDK runtime's flags and [`Flags`] (the chart tests
/// parse the chart's arguments with it).
pub type Cli = kubeairunway_sdk::runtime::Cli<Flags>;

impl ProviderFlags for Flags {
    type Provider = Dynamo;
    const ABOUT: &'static str =
        "Serves ModelDeployments whose provider is `dynamo` as DynamoGraphDeployments.";

    async fn provider_for(&self, _: &kube::Client) -> anyhow::Result<Dynamo> {
        Ok(self.provider())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_the_flags_defaults() {
        let cli = <Cli as clap::Parser>::try_parse_from(["dynamo-provider"]).unwrap();
        assert_eq!(
            format!("{:?}", cli.flags),
            format!("{:?}", Flags::default())
        );
    }
}
