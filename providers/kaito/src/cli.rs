//! The flags of `kaito-provider` (each also an environment variable): [`Flags`], its own,
//! which the `kubeairunway` CLI flattens into its commands to run the same provider, and
//! [`Cli`], the binary's (with the SDK runtime's), which the chart tests parse the chart's
//! arguments with.

use clap::ValueEnum;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kubeairunway_sdk::runtime::ProviderFlags;

use crate::inference_set_served;
use crate::nodes::NodeProvisioning;
use crate::settings::{INFERENCE_SET_CRD, KaitoProvider};

/// Whether replicas other than 1 are served by KAITO's InferenceSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InferenceSetMode {
    /// Use it when its CRD serves the version this provider renders (checked at start).
    Auto,
    /// Always use it.
    Enabled,
    /// Never: refuse replicas other than 1.
    Disabled,
}

/// How KAITO gets nodes: its `--node-provisioner` (v0.11+) or its
/// `disableNodeAutoProvisioning` feature gate (v0.10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NodeProvisioningMode {
    /// KAITO provisions a node per Workspace (its default): every Workspace names an
    /// instance type.
    Auto,
    /// Bring-your-own nodes: no instance type; nodes chosen by `spec.nodeSelector`.
    Byo,
}

/// The KAITO provider's own flags.
#[derive(Clone, Debug, clap::Args)]
#[group(id = "KaitoProviderFlags")]
#[command(next_help_heading = "KAITO provider")]
pub struct Flags {
    /// InferenceSet use for replicas other than 1.
    #[arg(long, env = "KAITO_INFERENCE_SET", value_enum, default_value = "auto")]
    pub inference_set: InferenceSetMode,
    /// How KAITO gets nodes: `auto` (KAITO's node auto-provisioning, its default) or
    /// `byo` (KAITO runs with --node-provisioner=byo, or before v0.11 with
    /// --feature-gates=disableNodeAutoProvisioning=true). Unset: `auto`, but for
    /// `kubeairunway render` and `kubeairunway up` on its local API server, where nothing
    /// provisions nodes: `byo`.
    #[arg(long, env = "KAITO_NODE_PROVISIONING", value_enum)]
    pub node_provisioning: Option<NodeProvisioningMode>,
    /// With `auto`: `resource.instanceType` of deployments with GPUs (a GPU SKU KAITO
    /// supports, e.g. Standard_NC24ads_A100_v4).
    #[arg(
        long,
        env = "KAITO_GPU_INSTANCE_TYPE",
        default_value = "",
        alias = "instance-type"
    )]
    pub gpu_instance_type: String,
    /// With `auto`: `resource.instanceType` of CPU-only deployments (e.g. Standard_D8s_v3).
    #[arg(long, env = "KAITO_CPU_INSTANCE_TYPE", default_value = "")]
    pub cpu_instance_type: String,
}

impl Default for Flags {
    fn default() -> Self {
        Self {
            inference_set: InferenceSetMode::Auto,
            node_provisioning: None,
            gpu_instance_type: String::new(),
            cpu_instance_type: String::new(),
        }
    }
}

impl Flags {
    /// The provider these flags configure, where the installed InferenceSet CRD is
    /// `inference_set_crd` (read only with `--inference-set=auto`) and node provisioning is
    /// `unset` unless `--node-provisioning` says otherwise.
    pub fn provider(
        &self,
        inference_set_crd: Option<&CustomResourceDefinition>,
        unset: NodeProvisioningMode,
    ) -> KaitoProvider {
        let inference_set = match self.inference_set {
            InferenceSetMode::Enabled => true,
            InferenceSetMode::Disabled => false,
            InferenceSetMode::Auto => inference_set_served(inference_set_crd),
        };
        let nodes = match self.node_provisioning.unwrap_or(unset) {
            NodeProvisioningMode::Auto => {
                NodeProvisioning::auto(&self.gpu_instance_type, &self.cpu_instance_type)
            }
            NodeProvisioningMode::Byo => NodeProvisioning::Byo,
        };
        KaitoProvider {
            inference_set,
            nodes,
        }
    }
}

/// The binary's command line: the SDK runtime's flags and [`Flags`] (the chart tests
/// parse the chart's arguments with it).
pub type Cli = kubeairunway_sdk::runtime::Cli<Flags>;

impl ProviderFlags for Flags {
    type Provider = KaitoProvider;
    const ABOUT: &'static str = "kubeairunway provider for KAITO";

    /// The provider these flags configure on `client`'s cluster: with
    /// `--inference-set=auto`, whether the installed InferenceSet CRD (one read of it)
    /// serves the version rendered; node provisioning `auto` unless set.
    async fn provider_for(&self, client: &kube::Client) -> anyhow::Result<KaitoProvider> {
        let crd = match self.inference_set {
            InferenceSetMode::Auto => {
                kube::Api::<CustomResourceDefinition>::all(client.clone())
                    .get_opt(INFERENCE_SET_CRD)
                    .await?
            }
            InferenceSetMode::Enabled | InferenceSetMode::Disabled => None,
        };
        let provider = self.provider(crd.as_ref(), NodeProvisioningMode::Auto);
        tracing::info!(
            inference_set = provider.inference_set,
            "KAITO InferenceSet for replicas other than 1"
        );
        tracing::info!(nodes = ?provider.nodes, "KAITO node provisioning");
        Ok(provider)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_node_provisioning_is_auto_for_the_binary_and_default_is_the_flags_defaults() {
        let cli = <Cli as clap::Parser>::try_parse_from([
            "kaito-provider",
            "--gpu-instance-type=Standard_NC6s_v3",
        ])
        .unwrap();
        assert_eq!(
            cli.flags.provider(None, NodeProvisioningMode::Auto).nodes,
            NodeProvisioning::auto("Standard_NC6s_v3", "")
        );
        let cli =
            <Cli as clap::Parser>::try_parse_from(["kaito-provider", "--node-provisioning=byo"])
                .unwrap();
        assert_eq!(
            cli.flags.provider(None, NodeProvisioningMode::Auto).nodes,
            NodeProvisioning::Byo
        );
        let defaults = <Cli as clap::Parser>::try_parse_from(["kaito-provider"])
            .unwrap()
            .flags;
        assert_eq!(format!("{defaults:?}"), format!("{:?}", Flags::default()));
    }
}
