//! `provider.overrides` for KubeRay: the Ray head's resources and start
//! parameters (`head`). Parsed with [`kubeairunway_sdk::overrides::parse`]: unknown keys
//! under `head` and wrong types fail. Every other key is merged into the RayService by the
//! runtime (`kubeairunway_sdk::overrides`).

use std::collections::BTreeMap;

use kubeairunway_sdk::RenderError;
use serde::Deserialize;

/// The top-level override keys the provider reads itself (`Provider::typed_overrides`).
pub const TYPED: [&str; 1] = ["head"];

/// `rayStartParams` KubeRay refuses on the head (see [`KubeRayOverrides::check`]).
pub const REFUSED_HEAD_PARAMS: [&str; 2] = ["labels", "redis-username"];

/// Default CPU of the Ray head.
pub const DEFAULT_HEAD_CPU: &str = "4";
/// Default memory of the Ray head.
pub const DEFAULT_HEAD_MEMORY: &str = "16Gi";

/// The documented keys.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeRayOverrides {
    /// The Ray head group.
    pub head: Option<HeadOverrides>,
}

/// `head.*`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HeadOverrides {
    /// `head.resources`.
    pub resources: Option<HeadResources>,
    /// `head.rayStartParams`: `ray start` parameters of the head (strings).
    pub ray_start_params: Option<BTreeMap<String, String>>,
}

/// `head.resources`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct HeadResources {
    /// CPU of the head (default `"4"`).
    pub cpu: Option<String>,
    /// Memory of the head (default `"16Gi"`).
    pub memory: Option<String>,
}

impl KubeRayOverrides {
    /// The head's CPU, overridden or default.
    pub fn head_cpu(&self) -> &str {
        self.head_resources()
            .and_then(|r| r.cpu.as_deref())
            .unwrap_or(DEFAULT_HEAD_CPU)
    }

    /// The head's memory, overridden or default.
    pub fn head_memory(&self) -> &str {
        self.head_resources()
            .and_then(|r| r.memory.as_deref())
            .unwrap_or(DEFAULT_HEAD_MEMORY)
    }

    /// The head's `rayStartParams`, overridden or empty.
    pub fn head_ray_start_params(&self) -> BTreeMap<String, String> {
        self.head
            .as_ref()
            .and_then(|h| h.ray_start_params.clone())
            .unwrap_or_default()
    }

    /// `head.rayStartParams` keys KubeRay refuses: `labels` (`ray-operator/controllers/ray/utils/validation.go:72-75@v1.7.0`)
    /// and `redis-username` (`:69-72@v1.3.0`, `:192-195@v1.7.0`); 1.3 would only refuse
    /// the RayCluster in an event, and the deployment never start.
    pub fn check(&self) -> Result<(), RenderError> {
        let params = self.head_ray_start_params();
        match REFUSED_HEAD_PARAMS
            .iter()
            .find(|k| params.contains_key(**k))
        {
            Some(key) => Err(RenderError(format!(
                "provider.overrides.head.rayStartParams.{key} is refused by KubeRay; remove it"
            ))),
            None => Ok(()),
        }
    }

    fn head_resources(&self) -> Option<&HeadResources> {
        self.head.as_ref().and_then(|h| h.resources.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_sdk::overrides::parse_value;
    use serde_json::json;

    #[test]
    fn defaults_when_absent() {
        let o = KubeRayOverrides::default();
        assert_eq!(
            (o.head_cpu(), o.head_memory()),
            (DEFAULT_HEAD_CPU, DEFAULT_HEAD_MEMORY)
        );
        assert!(o.head_ray_start_params().is_empty());
    }

    #[test]
    fn head_keys_are_typed() {
        let o = parse_value::<KubeRayOverrides>(json!({
            "head": {"resources": {"cpu": "8", "memory": "8Gi"},
                     "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"}},
        }))
        .unwrap();
        assert_eq!((o.head_cpu(), o.head_memory()), ("8", "8Gi"));
        assert_eq!(
            o.head_ray_start_params(),
            BTreeMap::from([
                ("dashboard-host".to_string(), "0.0.0.0".to_string()),
                ("num-cpus".to_string(), "0".to_string()),
            ])
        );
    }

    #[test]
    fn unknown_keys_under_head_are_refused_at_any_depth() {
        let err = parse_value::<KubeRayOverrides>(json!({
            "head": {"resources": {"cpu": "2", "gpu": "1"}, "replicsa": 2},
        }))
        .unwrap_err();
        assert_eq!(
            err.0,
            "unknown override provider.overrides.head.replicsa, provider.overrides.head.resources.gpu: this provider reads provider.overrides.head itself and has no such setting"
        );
    }

    #[test]
    fn head_parameters_kuberay_refuses_are_refused_validation_go_72_v1_7_0() {
        for key in REFUSED_HEAD_PARAMS {
            let o =
                parse_value::<KubeRayOverrides>(json!({"head": {"rayStartParams": {key: "x"}}}))
                    .unwrap();
            let err = o.check().unwrap_err();
            assert!(err.0.contains(key), "{}", err.0);
        }
        let o =
            parse_value::<KubeRayOverrides>(json!({"head": {"rayStartParams": {"num-cpus": "0"}}}))
                .unwrap();
        assert_eq!(o.check(), Ok(()));
    }

    #[test]
    fn wrong_types_fail_with_the_path() {
        let err =
            parse_value::<KubeRayOverrides>(json!({"head": {"rayStartParams": {"num-cpus": 0}}}))
                .unwrap_err();
        assert!(
            err.0
                .starts_with("invalid override provider.overrides.head.rayStartParams.num-cpus"),
            "{}",
            err.0
        );
        let err = parse_value::<KubeRayOverrides>(json!({"head": {"resources": {"cpu": 4}}}))
            .unwrap_err();
        assert!(
            err.0
                .starts_with("invalid override provider.overrides.head.resources.cpu"),
            "{}",
            err.0
        );
    }
}
