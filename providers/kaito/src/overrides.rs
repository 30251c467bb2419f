//! `spec.provider.overrides` for KAITO: KAITO has no supported overrides
//! (aggregated mode only, no separate router), so every key is unknown and warns.

use kubeairunway_sdk::api::ModelDeployment;
use kubeairunway_sdk::{RenderError, Warning};
use serde::Deserialize;

/// The documented KAITO overrides: none.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct KaitoOverrides {}

/// Parse the overrides: every key becomes an `UnknownOverride` warning.
pub fn parse(md: &ModelDeployment) -> Result<(KaitoOverrides, Vec<Warning>), RenderError> {
    kubeairunway_sdk::overrides::parse::<KaitoOverrides>(md)
}
