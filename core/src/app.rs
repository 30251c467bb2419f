//! The controller process on the SDK's process runtime: the webhook server and the
//! InferenceProviderConfig cache on every replica, the reconciler on the leader.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use kubeairunway_sdk::admission::{self, Configurations, WebhookOptions};
use kubeairunway_sdk::process::{self, Runtime};

use crate::gateway::controller as gateway;
use crate::gateway::decide::GatewayRef;
use crate::metrics::Metrics;
use crate::reconciler::{self, Settings};
use crate::{FIELD_MANAGER, selection, webhook};

/// The component's name: its Lease, its events' reporter, its logs.
pub const COMPONENT: &str = "kubeairunway-controller";

/// Flags of `kubeairunway-controller` (each also from an environment variable).
#[derive(Clone, Debug, Parser)]
#[command(
    name = "kubeairunway-controller",
    version,
    about = "kubeairunway core controller: ModelDeployment webhooks and provider selection"
)]
pub struct Cli {
    /// Flags every binary shares: metrics address, log format, leader election.
    #[command(flatten)]
    pub process: process::Options,
    /// The webhook server and its certificate.
    #[command(flatten)]
    pub webhook: WebhookOptions,
    /// Run the built-in provider selection; off when a custom selector sets status.provider.name.
    #[arg(long, env = "ENABLE_PROVIDER_SELECTOR", default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_provider_selector: bool,
    /// Providers whose heartbeat is older than this are not selected.
    #[arg(long, env = "PROVIDER_HEARTBEAT_MAX_AGE", default_value = "5m", value_parser = kubeairunway_sdk::process::parse_duration)]
    pub provider_heartbeat_max_age: Duration,
    /// How long a deleted ModelDeployment waits for a provider that is gone (its
    /// InferenceProviderConfig deleted, or its heartbeat older than this and than
    /// --provider-heartbeat-max-age) to remove its finalizer, before core removes it with a
    /// warning event.
    #[arg(long, env = "FINALIZER_TIMEOUT", default_value = "5m", value_parser = kubeairunway_sdk::process::parse_duration)]
    pub finalizer_timeout: Duration,
    /// Only reconcile ModelDeployments of this namespace (default: all).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Run the gateway: InferencePool, endpoint picker and HTTPRoute for every
    /// ModelDeployment with spec.gateway.enabled (needs the Gateway API and its Inference
    /// Extension CRDs; without them such ModelDeployments report GatewayReady=False).
    #[arg(long, env = "ENABLE_GATEWAY", default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_gateway: bool,
    /// The Gateway to route models from, as <namespace>/<name>; default: the only Gateway,
    /// else the one labelled kubeairunway.ai/inference-gateway=true. It is never changed.
    #[arg(long, env = "GATEWAY", value_parser = gateway::parse_gateway)]
    pub gateway: Option<GatewayRef>,
    /// Serve the admission webhooks (and manage their certificate).
    #[arg(long, env = "ENABLE_WEBHOOKS", default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_webhooks: bool,
    /// Name of the ValidatingWebhookConfiguration to patch the CA bundle into.
    #[arg(
        long,
        env = "VALIDATING_WEBHOOK_CONFIGURATION",
        default_value = "kubeairunway-validating-webhook"
    )]
    pub validating_webhook_configuration: String,
    /// Name of the MutatingWebhookConfiguration to patch the CA bundle into.
    #[arg(
        long,
        env = "MUTATING_WEBHOOK_CONFIGURATION",
        default_value = "kubeairunway-mutating-webhook"
    )]
    pub mutating_webhook_configuration: String,
}

/// The webhook Service's default name (the certificate's DNS names derive from it).
pub const WEBHOOK_SERVICE: &str = "kubeairunway-webhook";

/// Run the controller on `rt` until the process stops.
pub async fn run(cli: Cli, mut rt: Runtime) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new(rt.registry()));
    let (providers, reflector) = reconciler::provider_cache(rt.client());
    tokio::spawn(reflector);
    {
        // The validating webhook and selection read this cache.
        let (providers, synced) = (
            providers.clone(),
            rt.readiness()
                .process_check("InferenceProviderConfig cache"),
        );
        tokio::spawn(async move {
            if providers.synced().await {
                synced.set();
            }
        });
    }
    if cli.enable_webhooks {
        let mut options = cli.webhook.clone();
        options
            .webhook_service_name
            .get_or_insert_with(|| WEBHOOK_SERVICE.to_string());
        let configurations = Configurations {
            validating: Some(cli.validating_webhook_configuration.clone()),
            mutating: Some(cli.mutating_webhook_configuration.clone()),
        };
        let foresight = webhook::Foresight::new(
            cli.enable_provider_selector,
            selection::Settings {
                heartbeat_max_age: cli.provider_heartbeat_max_age,
            },
        );
        let router = webhook::router(
            webhook::WebhookState::new(Some(providers.clone()))
                .foreseeing(foresight)
                .reviewing_access(rt.client()),
        );
        admission::serve(&rt, &options, &configurations, router).await?;
    }
    let settings = Settings {
        enable_provider_selector: cli.enable_provider_selector,
        selection: selection::Settings {
            heartbeat_max_age: cli.provider_heartbeat_max_age,
        },
        finalizer_timeout: cli.finalizer_timeout,
        namespace: cli.watch_namespace.clone(),
        reporter: kubeairunway_sdk::events::Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(rt.identity()),
        },
        ..Settings::default()
    };
    let gateway_settings = cli.enable_gateway.then(|| gateway::Settings {
        gateway: cli.gateway.clone(),
        namespace: cli.watch_namespace.clone(),
    });
    let client = rt.client();
    let synced = rt.readiness().term_check("ModelDeployment cache");
    rt.run(|term| {
        let (client, providers, settings, metrics, synced) = (
            client.clone(),
            providers.store.clone(),
            settings.clone(),
            Arc::clone(&metrics),
            synced.clone(),
        );
        let gateway_settings = gateway_settings.clone();
        async move {
            // One watch of ModelDeployments for core and its gateway.
            let (mds, events) =
                reconciler::model_deployments(&client, settings.namespace.as_deref());
            let gateway = async {
                if let Some(s) = gateway_settings {
                    gateway::run(client.clone(), s, mds.clone(), term.ended()).await;
                }
            };
            let ended = {
                let term = term.clone();
                async move { term.ended().await }
            };
            let core = reconciler::run(
                client.clone(),
                mds.clone(),
                events,
                providers,
                settings,
                metrics,
                synced,
                ended,
            );
            tokio::join!(core, gateway);
            Ok(())
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_with_defaults_and_selector_off() {
        let cli = Cli::try_parse_from(["c", "--enable-provider-selector=false"]).unwrap();
        assert!(!cli.enable_provider_selector);
        assert!(!cli.process.leader_elect);
        assert_eq!(cli.webhook.webhook_bind_address.port(), 9443);
        assert_eq!(cli.provider_heartbeat_max_age, Duration::from_secs(300));
    }
}
