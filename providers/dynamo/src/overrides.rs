//! `provider.overrides` the Dynamo provider reads: `routerMode`,
//! `frontend.replicas`, `frontend.resources.cpu`, `frontend.resources.memory`, and
//! `runtimeVersion` (the Dynamo runtime version of a custom image, rendered as v1beta1's
//! `runtimeVersionOverride`). Every other key is merged into the DynamoGraphDeployment by
//! the runtime (`kubeairunway_sdk::overrides`), e.g. `spec.services.VllmWorker.replicas`.

use kubeairunway_sdk::{ModelDeployment, RenderError, overrides};
use serde::Deserialize;

/// The top-level override keys the provider reads itself (`Provider::typed_overrides`).
pub const TYPED: [&str; 3] = ["routerMode", "frontend", "runtimeVersion"];

/// Dynamo's router modes (`DYN_ROUTER_MODE` of `dynamo.frontend`).
pub const ROUTER_MODES: [&str; 7] = [
    "round-robin",
    "random",
    "power-of-two",
    "kv",
    "direct",
    "least-loaded",
    "device-aware-weighted",
];
/// The router mode when none is asked for.
pub const DEFAULT_ROUTER_MODE: &str = "round-robin";
/// Frontend replicas when none are asked for.
pub const DEFAULT_FRONTEND_REPLICAS: i32 = 1;
/// Frontend CPU request when none is asked for.
pub const DEFAULT_FRONTEND_CPU: &str = "2";
/// Frontend memory request when none is asked for.
pub const DEFAULT_FRONTEND_MEMORY: &str = "4Gi";

/// The documented override keys, as the user wrote them.
#[derive(Deserialize, Default, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase", default)]
struct Raw {
    router_mode: Option<String>,
    frontend: Option<RawFrontend>,
    runtime_version: Option<String>,
}

#[derive(Deserialize, Default, Debug, Clone, PartialEq)]
#[serde(default)]
struct RawFrontend {
    replicas: Option<i32>,
    resources: Option<RawResources>,
}

#[derive(Deserialize, Default, Debug, Clone, PartialEq)]
#[serde(default)]
struct RawResources {
    cpu: Option<String>,
    memory: Option<String>,
}

/// Overrides with their defaults applied and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overrides {
    /// `DYN_ROUTER_MODE` of the frontend.
    pub router_mode: String,
    /// Frontend replicas.
    pub frontend_replicas: i32,
    /// Frontend CPU request.
    pub frontend_cpu: String,
    /// Frontend memory request.
    pub frontend_memory: String,
    /// The Dynamo runtime version of the image, `MAJOR.MINOR.PATCH`.
    pub runtime_version: Option<String>,
    /// Whether the user set `routerMode` or `frontend` (not applicable in gateway mode,
    /// which has no standalone frontend).
    pub frontend_asked: bool,
}

/// Whether `v` is a `MAJOR.MINOR.PATCH` the v1beta1 CRD accepts as `runtimeVersionOverride`
/// (its pattern `^(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})$`, see
/// tests/fixtures/crds/upstream/nvidia.com_dynamographdeployments.yaml).
pub fn is_runtime_version(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.len() <= 4
                && p.bytes().all(|b| b.is_ascii_digit())
                && (p.len() == 1 || !p.starts_with('0'))
        })
}

/// Parse and validate `md`'s typed overrides: unknown keys under them, wrong types and
/// unknown router modes fail.
pub fn parse(md: &ModelDeployment) -> Result<Overrides, RenderError> {
    let raw = overrides::parse::<Raw>(md, &TYPED)?;
    let frontend_asked = raw.router_mode.is_some() || raw.frontend.is_some();
    let router_mode = raw
        .router_mode
        .unwrap_or_else(|| DEFAULT_ROUTER_MODE.to_string());
    if !ROUTER_MODES.contains(&router_mode.as_str()) {
        return Err(RenderError(format!(
            "invalid override provider.overrides.routerMode: {router_mode:?} is not a Dynamo router mode (one of {})",
            ROUTER_MODES.join(", ")
        )));
    }
    let frontend = raw.frontend.unwrap_or_default();
    let frontend_replicas = frontend.replicas.unwrap_or(DEFAULT_FRONTEND_REPLICAS);
    if frontend_replicas < 0 {
        return Err(RenderError(format!(
            "invalid override provider.overrides.frontend.replicas: {frontend_replicas} is negative"
        )));
    }
    if let Some(v) = raw
        .runtime_version
        .as_deref()
        .filter(|v| !is_runtime_version(v))
    {
        return Err(RenderError(format!(
            "invalid override provider.overrides.runtimeVersion: {v:?} is not a MAJOR.MINOR.PATCH version such as \"1.4.0\""
        )));
    }
    let resources = frontend.resources.unwrap_or_default();
    let nonempty = |v: Option<String>, default: &str| {
        v.filter(|s| !s.is_empty())
            .unwrap_or_else(|| default.to_string())
    };
    Ok(Overrides {
        router_mode,
        frontend_replicas,
        frontend_cpu: nonempty(resources.cpu, DEFAULT_FRONTEND_CPU),
        frontend_memory: nonempty(resources.memory, DEFAULT_FRONTEND_MEMORY),
        runtime_version: raw.runtime_version,
        frontend_asked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_sdk::testing::ModelDeploymentBuilder;
    use serde_json::json;

    fn parsed(o: serde_json::Value) -> Result<Overrides, RenderError> {
        parse(&ModelDeploymentBuilder::new("m").overrides(o).build())
    }

    #[test]
    fn defaults_when_absent() {
        let o = parse(&ModelDeploymentBuilder::new("m").build()).unwrap();
        assert_eq!(
            o,
            Overrides {
                router_mode: "round-robin".into(),
                frontend_replicas: 1,
                frontend_cpu: "2".into(),
                frontend_memory: "4Gi".into(),
                runtime_version: None,
                frontend_asked: false,
            }
        );
    }

    #[test]
    fn every_router_mode_is_accepted_and_others_refused() {
        for mode in ROUTER_MODES {
            assert_eq!(
                parsed(json!({"routerMode": mode})).unwrap().router_mode,
                mode
            );
        }
        let err = parsed(json!({"routerMode": "none"})).unwrap_err();
        assert_eq!(
            err.0,
            "invalid override provider.overrides.routerMode: \"none\" is not a Dynamo router mode (one of round-robin, random, power-of-two, kv, direct, least-loaded, device-aware-weighted)"
        );
    }

    #[test]
    fn unknown_keys_under_typed_ones_and_wrong_types_fail_the_rest_is_merged() {
        let o = parsed(json!({
            "frontend": {"replicas": 2, "resources": {"cpu": "4", "memory": "8Gi"}},
            "router-mode": "kv",
        }))
        .unwrap();
        assert_eq!(
            (
                o.frontend_replicas,
                o.frontend_cpu.as_str(),
                o.frontend_memory.as_str()
            ),
            (2, "4", "8Gi")
        );
        let md = ModelDeploymentBuilder::new("m")
            .overrides(json!({"frontend": {"replicas": 2}, "router-mode": "kv"}))
            .build();
        assert_eq!(
            overrides::patch(&md, &TYPED).map(serde_json::Value::Object),
            Some(json!({"router-mode": "kv"})),
            "left to the runtime's merge, which the schema refuses"
        );
        let err = parsed(json!({"frontend": {"resources": {"gpu": 1}}})).unwrap_err();
        assert!(
            err.0
                .starts_with("unknown override provider.overrides.frontend.resources.gpu:"),
            "{}",
            err.0
        );
        let err = parsed(json!({"frontend": {"replicas": "two"}})).unwrap_err();
        assert!(
            err.0
                .starts_with("invalid override provider.overrides.frontend.replicas:"),
            "{}",
            err.0
        );
        let err = parsed(json!({"frontend": {"replicas": -1}})).unwrap_err();
        assert!(err.0.contains("negative"), "{}", err.0);
    }

    #[test]
    fn runtime_version_is_a_plain_semver_core() {
        for ok in ["1.4.0", "0.0.0", "10.20.3"] {
            assert_eq!(
                parsed(json!({"runtimeVersion": ok}))
                    .unwrap()
                    .runtime_version
                    .as_deref(),
                Some(ok)
            );
        }
        for bad in ["v1.4.0", "1.4", "1.4.0-rc1", "01.4.0", "12345.0.0", ""] {
            let err = parsed(json!({"runtimeVersion": bad})).unwrap_err();
            assert!(
                err.0
                    .starts_with("invalid override provider.overrides.runtimeVersion"),
                "{bad}: {}",
                err.0
            );
        }
    }
}
