//! What the KAITO provider is: its name and KAITO's API group, and what it is configured
//! with ([`KaitoProvider`]).

use crate::nodes::NodeProvisioning;

/// The provider's name: `status.provider.name`, its InferenceProviderConfig, field manager
/// stem.
pub const NAME: &str = "kaito";
/// KAITO's API group.
pub const GROUP: &str = "kaito.sh";
/// The InferenceSet CRD, which serves more than one replica.
pub const INFERENCE_SET_CRD: &str = "inferencesets.kaito.sh";

/// The KAITO provider.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KaitoProvider {
    /// Whether KAITO's InferenceSet CRD is available: `scaling.replicas` other than 1 is
    /// served by an InferenceSet when true, and refused when false.
    pub inference_set: bool,
    /// How KAITO gets nodes, and the instance types it provisions.
    pub nodes: NodeProvisioning,
}
