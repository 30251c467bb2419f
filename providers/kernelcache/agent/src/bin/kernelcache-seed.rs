//! `kernelcache-seed`: the init container that copies a staged kernel cache into the
//! serving pod's writable directory. Always exits 0: a missing or broken cache means the
//! engine compiles its kernels as usual. See `kubeairunway_kernelcache_agent::seed`.

use std::path::PathBuf;

use clap::Parser;

/// Copy a staged kernel cache into the pod.
#[derive(Parser)]
#[command(name = "kernelcache-seed", version)]
struct Cli {
    /// The cache directory in the read-only source volume.
    #[arg(long)]
    from: PathBuf,
    /// The pod's writable cache directory.
    #[arg(long)]
    to: PathBuf,
}

fn main() {
    let cli = Cli::parse();
    kubeairunway_sdk::process::init_logging(kubeairunway_sdk::process::LogFormat::Text);
    kubeairunway_kernelcache_agent::seed::main_with(&cli.from, &cli.to);
}
