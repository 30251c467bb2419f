//! `kubectl-airunway`: `kubeairunway` as a kubectl plugin (`kubectl airunway ...`).

#[tokio::main]
async fn main() -> std::process::ExitCode {
    kubeairunway_cli::main().await
}
