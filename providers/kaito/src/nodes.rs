//! How KAITO gets nodes, and so what `resource.instanceType` must be. KAITO's webhook
//! ties the instance type to its node provisioning (docs/upstream.md#kaito-node-provisioning):
//!
//! - node auto-provisioning (KAITO's default): every Workspace must name an instance type
//!   KAITO's SKU table knows, and KAITO creates a node of that type for it;
//! - bring-your-own nodes: the instance type must be empty; the Workspace runs on the
//!   nodes its `resource.labelSelector` matches, which for a preset must carry NVIDIA GPU
//!   Feature Discovery labels (`nvidia.com/gpu.product`, `gpu.count`, `gpu.memory`).
//!
//! `resource.preferredNodes` is deprecated in v1beta1 and unused, so it is never rendered.
//! The InferenceSet webhook has the same rule for `spec.template.resource.instanceType`.

use kubeairunway_sdk::api::ModelDeployment;

/// How KAITO gets nodes for the Workspaces this provider renders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeProvisioning {
    /// KAITO provisions a node per Workspace: every Workspace names the instance type,
    /// one for GPU deployments and one for CPU-only ones.
    Auto {
        /// Instance type of deployments with GPUs (e.g. `Standard_NC24ads_A100_v4`).
        gpu_instance_type: Option<String>,
        /// Instance type of CPU-only deployments (e.g. `Standard_D8s_v3`).
        cpu_instance_type: Option<String>,
    },
    /// Bring-your-own nodes: no instance type; nodes are chosen by `spec.nodeSelector`.
    Byo,
}

impl Default for NodeProvisioning {
    /// KAITO's own default: node auto-provisioning, with no instance type configured yet.
    fn default() -> Self {
        NodeProvisioning::Auto {
            gpu_instance_type: None,
            cpu_instance_type: None,
        }
    }
}

impl NodeProvisioning {
    /// Auto-provisioning with these instance types (empty strings count as unset).
    pub fn auto(gpu: &str, cpu: &str) -> Self {
        let set = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
        NodeProvisioning::Auto {
            gpu_instance_type: set(gpu),
            cpu_instance_type: set(cpu),
        }
    }

    /// `resource.instanceType` for `md`: none with bring-your-own nodes, the GPU or CPU
    /// instance type with auto-provisioning, or why it cannot be rendered.
    pub fn instance_type(&self, md: &ModelDeployment) -> Result<Option<&str>, String> {
        let NodeProvisioning::Auto {
            gpu_instance_type,
            cpu_instance_type,
        } = self
        else {
            return Ok(None);
        };
        let (kind, value, flag, value_name) = if md.spec.uses_gpu() {
            (
                "GPU",
                gpu_instance_type,
                "--gpu-instance-type",
                "nodeProvisioning.gpuInstanceType",
            )
        } else {
            (
                "CPU-only",
                cpu_instance_type,
                "--cpu-instance-type",
                "nodeProvisioning.cpuInstanceType",
            )
        };
        match value.as_deref().filter(|v| !v.is_empty()) {
            Some(v) => Ok(Some(v)),
            None => Err(format!(
                "KAITO provisions a node for each Workspace (node auto-provisioning) and \
                 requires resource.instanceType, but no {kind} instance type is configured: \
                 set the kaito-provider's {flag} (chart value {value_name}), or run KAITO with \
                 bring-your-own nodes and the kaito-provider with --node-provisioning=byo \
                 (chart value nodeProvisioning.mode=byo)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn md(gpus: i32) -> ModelDeployment {
        serde_json::from_value(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m"},
            "spec": {"model": {"id": "a/b"}, "engine": {"type": "llamacpp"},
                     "resources": {"gpu": {"count": gpus}}},
        }))
        .unwrap()
    }

    #[test]
    fn gpu_and_cpu_deployments_get_their_own_instance_types() {
        let nodes = NodeProvisioning::auto("Standard_NC24ads_A100_v4", "Standard_D8s_v3");
        assert_eq!(
            nodes.instance_type(&md(1)),
            Ok(Some("Standard_NC24ads_A100_v4"))
        );
        assert_eq!(nodes.instance_type(&md(0)), Ok(Some("Standard_D8s_v3")));
    }

    #[test]
    fn bring_your_own_nodes_never_name_an_instance_type() {
        assert_eq!(NodeProvisioning::Byo.instance_type(&md(1)), Ok(None));
        assert_eq!(NodeProvisioning::Byo.instance_type(&md(0)), Ok(None));
    }

    #[test]
    fn a_missing_instance_type_says_what_to_set() {
        let nodes = NodeProvisioning::auto("Standard_NC6s_v3", "");
        let err = nodes.instance_type(&md(0)).unwrap_err();
        assert!(err.contains("no CPU-only instance type"), "{err}");
        assert!(err.contains("--cpu-instance-type"), "{err}");
        assert!(err.contains("nodeProvisioning.cpuInstanceType"), "{err}");
        assert!(err.contains("--node-provisioning=byo"), "{err}");
        let err = NodeProvisioning::default()
            .instance_type(&md(2))
            .unwrap_err();
        assert!(err.contains("no GPU instance type"), "{err}");
        assert!(err.contains("nodeProvisioning.gpuInstanceType"), "{err}");
    }
}
