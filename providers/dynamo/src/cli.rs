//! The flags of `dynamo-provider` (each also an environment variable), here so that the
//! chart tests parse the chart's arguments with them.

use std::time::Duration;

use clap::Parser;

use crate::{DEFAULT_DYNAMO_VERSION, Dynamo, Settings};

/// Serves ModelDeployments whose provider is `dynamo` as DynamoGraphDeployments.
#[derive(Debug, Parser)]
#[command(name = "dynamo-provider", version, about)]
pub struct Cli {
    /// The SDK runtime's flags.
    #[command(flatten)]
    pub options: kubeairunway_sdk::runtime::Options,
    /// Tag of the `nvcr.io/nvidia/ai-dynamo/{vllm,sglang,tensorrtllm}-runtime` images.
    #[arg(long, env = "DYNAMO_VERSION", default_value = DEFAULT_DYNAMO_VERSION)]
    pub dynamo_version: String,
    /// How long Dynamo's `failed` state must last before the ModelDeployment is Failed.
    #[arg(long, env = "FAILED_THRESHOLD", default_value = "5m", value_parser = kubeairunway_sdk::process::parse_duration)]
    pub failed_threshold: Duration,
}

impl Cli {
    /// The provider these flags configure.
    pub fn provider(&self) -> Dynamo {
        Dynamo::new(Settings {
            dynamo_version: self.dynamo_version.clone(),
            failed_after: self.failed_threshold,
        })
    }
}
