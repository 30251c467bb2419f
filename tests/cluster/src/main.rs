//! `testcluster`: run the integration-test API server by hand.
//!
//! ```text
//! eval "$(cargo run -q -p kubeairunway-testcluster -- up)"   # start, print export lines
//! cargo run -q -p kubeairunway-testcluster -- down          # stop
//! ```

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use kubeairunway_testcluster::{Lifetime, TestCluster, binaries, cache_dir, stop_detached};

#[derive(Parser)]
#[command(
    about = "A local Kubernetes API server (etcd + the upstream apiserver code: CRDs, built-in kinds, webhook admission) for development and tests"
)]
struct Cli {
    /// Directory for certificates, kubeconfig, logs and data.
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the binaries if needed (cached in the user cache directory).
    Build,
    /// Start a cluster that keeps running; prints shell `export` lines.
    Up,
    /// Stop the cluster started by `up`.
    Down,
    /// Print the `export` lines of the running cluster.
    Env,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let dir = cli.dir.unwrap_or_else(|| cache_dir().join("dev"));
    match cli.command {
        Cmd::Build => println!("{}", binaries()?.display()),
        Cmd::Up => {
            stop_detached(&dir)?;
            let cluster = TestCluster::start(&dir, Lifetime::Detached)?;
            eprintln!(
                "API server ready at {}; stop it with `testcluster down`",
                cluster.server()
            );
            print!("{}", cluster.env());
        }
        Cmd::Down => stop_detached(&dir)?,
        Cmd::Env => print!("{}", std::fs::read_to_string(dir.join("env"))?),
    }
    Ok(())
}
