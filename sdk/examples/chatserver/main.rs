//! A third-party provider binary:
//!
//! ```text
//! cargo run -p kubeairunway-sdk --example chatserver -- crd | kubectl apply -f -
//! cargo run -p kubeairunway-sdk --example chatserver
//! ```

mod provider;

use kube::CustomResourceExt;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("crd") {
        println!(
            "{}",
            serde_json::to_string_pretty(&provider::ChatServer::crd())?
        );
        return Ok(());
    }
    let name = std::env::var("PROVIDER_NAME").unwrap_or_else(|_| "chatserver".into());
    kubeairunway_sdk::runtime::main(provider::ChatServerProvider { name }).await
}
