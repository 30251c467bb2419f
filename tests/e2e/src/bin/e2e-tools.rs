//! The commands the kernel-cache walk-through (docs/kernelcache.md) runs, in one binary
//! that behaves as the one its name (`argv[0]`) says, each exactly as its own binary's
//! `main`: `kubeairunway` (cli/src/main.rs), `kernelcache-controller` and
//! `kernelcache-agent`. The walk-through test
//! (`tests/e2e/tests/e2e/kernelcache_walkthrough.rs`) puts links of those names on `PATH`:
//! it runs under cargo, so it cannot build the binaries of other packages itself.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let name = std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let result = match name.as_str() {
        "kubeairunway" => return kubeairunway_cli::main().await,
        "kernelcache-controller" => kubeairunway_kernelcache_controller::app::main().await,
        "kernelcache-agent" => kubeairunway_kernelcache_agent::app::main().await,
        other => Err(anyhow::anyhow!(
            "e2e-tools runs as kubeairunway, kernelcache-controller or kernelcache-agent, not {other:?}"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}
