//! `kubeairunway`: see `kubeairunway_cli`.

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    kubeairunway_cli::main().await
}
