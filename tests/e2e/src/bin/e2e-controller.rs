//! `e2e-controller core|dynamo [FLAGS]`: core or the Dynamo provider, run exactly as their
//! binaries run them (same flags, same process runtime), as a process of its own so the
//! fault tests can SIGKILL and restart it (`tests/e2e/tests/e2e/faults.rs`).

use clap::Parser;
use kubeairunway_dynamo_provider::{Dynamo, Settings};
use kubeairunway_sdk::process::Runtime;

// Parsed once at start: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Parser)]
enum Role {
    /// Core, as `kubeairunway-controller`.
    Core(kubeairunway_core::app::Cli),
    /// The Dynamo provider, as `dynamo-provider` with its default settings.
    Dynamo(DynamoArgs),
}

/// The provider runtime's flags (a struct of its own: clap names an argument group after
/// the struct, and the runtime's `Options` flattens the process runtime's `Options`).
#[derive(Debug, clap::Args)]
struct DynamoArgs {
    #[command(flatten)]
    options: kubeairunway_sdk::runtime::Options,
}

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Role::parse() {
        Role::Core(cli) => {
            let rt = Runtime::start(kubeairunway_core::app::COMPONENT, cli.process.clone()).await?;
            kubeairunway_core::app::run(cli, rt).await
        }
        Role::Dynamo(DynamoArgs { options }) => {
            let rt = Runtime::start("dynamo-provider", options.process.clone()).await?;
            kubeairunway_sdk::runtime::run(Dynamo::new(Settings::default()), rt, options).await
        }
    }
}
