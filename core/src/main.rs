//! `kubeairunway-controller`: parse flags, start the process runtime, run.

use clap::Parser;
use kubeairunway_core::app::{COMPONENT, Cli, run};
use kubeairunway_sdk::process::Runtime;

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = Runtime::start(COMPONENT, cli.process.clone()).await?;
    run(cli, rt).await
}
