//! `kubeairunway`: see `kubeairunway_cli`.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    kubeairunway_cli::main().await
}
