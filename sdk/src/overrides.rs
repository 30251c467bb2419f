//! Typed `spec.provider.overrides`: each provider documents the keys it reads; unknown
//! keys warn, wrong types fail.
//!
//! A provider describes its documented keys as a serde type and calls [`parse`]. Every key
//! the type does not know, at any depth, comes back as a [`Warning`] naming its full path
//! (typos like `frontend.replicsa` are caught); a value of the wrong type is a
//! [`RenderError`] naming the path, which the runtime reports in the ModelDeployment's
//! status.
//!
//! ```
//! use serde::Deserialize;
//! #[derive(Deserialize, Default)]
//! #[serde(rename_all = "camelCase", default)]
//! struct MyOverrides { replicas: Option<i32>, router_mode: Option<String> }
//!
//! let md: kubeairunway_sdk::ModelDeployment = serde_json::from_value(serde_json::json!({
//!     "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
//!     "metadata": {"name": "m"},
//!     "spec": {"model": {"id": "a/b"}, "provider": {"overrides": {"replicas": 2, "replicsa": 3}}},
//! })).unwrap();
//! let (o, warnings) = kubeairunway_sdk::overrides::parse::<MyOverrides>(&md).unwrap();
//! assert_eq!(o.replicas, Some(2));
//! assert_eq!(warnings[0].message, "unknown override provider.overrides.replicsa is ignored");
//! ```

use serde::de::DeserializeOwned;

use crate::api::ModelDeployment;
use crate::provider::{RenderError, Warning};

/// Event reason of an unknown-key warning.
pub const UNKNOWN_OVERRIDE: &str = "UnknownOverride";

/// Parse `spec.provider.overrides` into `T` (its `Default` when absent).
pub fn parse<T: DeserializeOwned + Default>(
    md: &ModelDeployment,
) -> Result<(T, Vec<Warning>), RenderError> {
    let Some(map) = md.spec.provider.as_ref().and_then(|p| p.overrides.as_ref()) else {
        return Ok((T::default(), Vec::new()));
    };
    parse_value(serde_json::Value::Object(map.clone()))
}

/// Parse an overrides object into `T`: unknown keys as warnings, wrong types as an error.
pub fn parse_value<T: DeserializeOwned>(
    value: serde_json::Value,
) -> Result<(T, Vec<Warning>), RenderError> {
    let mut unknown = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(value, &mut track);
    let parsed = serde_ignored::deserialize(de, |path| unknown.push(dotted(&path)));
    match parsed {
        Ok(v) => {
            let warnings = unknown
                .into_iter()
                .map(|p| {
                    Warning::new(
                        UNKNOWN_OVERRIDE,
                        format!("unknown override provider.overrides.{p} is ignored"),
                    )
                })
                .collect();
            Ok((v, warnings))
        }
        Err(e) => {
            let path = track.path().to_string();
            let at = if path == "." {
                String::new()
            } else {
                format!(".{path}")
            };
            Err(RenderError(format!(
                "invalid override provider.overrides{at}: {e}"
            )))
        }
    }
}

/// `a.b[2].c` for an ignored key's path (serde_ignored marks `Option` layers with `?`).
fn dotted(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", dotted(parent)),
        Path::Map { parent, key } => {
            let p = dotted(parent);
            if p.is_empty() {
                key.clone()
            } else {
                format!("{p}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => dotted(parent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Deserialize, Default, Debug, PartialEq)]
    #[serde(rename_all = "camelCase", default)]
    struct Frontend {
        replicas: Option<i32>,
        resources: Option<Resources>,
    }

    #[derive(Deserialize, Default, Debug, PartialEq)]
    #[serde(default)]
    struct Resources {
        cpu: Option<String>,
        memory: Option<String>,
    }

    #[derive(Deserialize, Default, Debug, PartialEq)]
    #[serde(rename_all = "camelCase", default)]
    struct Overrides {
        router_mode: Option<String>,
        frontend: Option<Frontend>,
    }

    #[test]
    fn typed_values_and_unknown_keys_at_any_depth() {
        let (o, warnings) = parse_value::<Overrides>(json!({
            "routerMode": "kv",
            "frontend": {"replicsa": 2, "resources": {"cpu": "4", "gpu": "1"}},
            "typo": {"deep": 1},
        }))
        .unwrap();
        assert_eq!(o.router_mode.as_deref(), Some("kv"));
        assert_eq!(
            o.frontend.unwrap().resources.unwrap().cpu.as_deref(),
            Some("4")
        );
        let paths: Vec<_> = warnings.iter().map(|w| w.message.as_str()).collect();
        assert_eq!(
            paths,
            [
                "unknown override provider.overrides.frontend.replicsa is ignored",
                "unknown override provider.overrides.frontend.resources.gpu is ignored",
                "unknown override provider.overrides.typo is ignored",
            ]
        );
        assert!(warnings.iter().all(|w| w.reason == UNKNOWN_OVERRIDE));
    }

    #[test]
    fn wrong_type_names_the_path() {
        let err = parse_value::<Overrides>(json!({"frontend": {"replicas": "two"}})).unwrap_err();
        assert_eq!(
            err.0,
            "invalid override provider.overrides.frontend.replicas: invalid type: string \"two\", expected i32"
        );
    }

    #[test]
    fn absent_overrides_give_defaults() {
        let md: ModelDeployment = serde_json::from_value(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m"}, "spec": {"model": {"id": "a/b"}},
        }))
        .unwrap();
        let (o, w) = parse::<Overrides>(&md).unwrap();
        assert_eq!(o, Overrides::default());
        assert!(w.is_empty());
    }
}
