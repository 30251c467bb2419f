//! A third-party provider binary that needs no operator:
//!
//! ```text
//! PROVIDER_NAME=deployment cargo run -p kubeairunway-sdk --example deployment
//! ```

mod provider;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let name = std::env::var("PROVIDER_NAME").unwrap_or_else(|_| "deployment".into());
    kubeairunway_sdk::runtime::main(provider::DeploymentProvider { name }).await
}
