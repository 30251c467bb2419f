//! What a cache image says about itself: the GKM/MCV "compat" format.
//!
//! The image config carries labels `cache.triton.image/{entry-count,cache-size-bytes,
//! summary}` or `cache.vllm.image/{...}`; `summary` is a JSON document inside the label
//! string, `{"targets":[{"backend":"cuda","arch":"90","warp_size":32}, ...]}`. The single
//! gzip tar layer holds `io.triton.cache/` with `io.triton.manifest/manifest.json`, or
//! `io.vllm.cache/` with `io.vllm.manifest/manifest.json`.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// Manifests larger than this are refused (MCV writes one short entry per kernel).
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// Which framework a cache belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheType {
    /// A Triton kernel cache (`TRITON_CACHE_DIR`).
    Triton,
    /// A vLLM torch.compile cache (under `VLLM_CACHE_ROOT/torch_compile_cache`).
    Vllm,
}

impl CacheType {
    /// `triton` or `vllm`.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheType::Triton => "triton",
            CacheType::Vllm => "vllm",
        }
    }

    /// The directory of the layer that holds the cache.
    pub fn cache_dir(self) -> &'static str {
        match self {
            CacheType::Triton => "io.triton.cache",
            CacheType::Vllm => "io.vllm.cache",
        }
    }

    /// The path of the manifest inside the layer.
    pub fn manifest_path(self) -> &'static str {
        match self {
            CacheType::Triton => "io.triton.manifest/manifest.json",
            CacheType::Vllm => "io.vllm.manifest/manifest.json",
        }
    }

    fn label_prefix(self) -> &'static str {
        match self {
            CacheType::Triton => "cache.triton.image/",
            CacheType::Vllm => "cache.vllm.image/",
        }
    }
}

impl fmt::Display for CacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A GPU target a cache was built for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `cuda` or `hip` (lowercase).
    pub backend: String,
    /// Architecture: CUDA as `major*10+minor` digits (an `sm_` prefix is dropped), HIP as
    /// `gfx...`.
    pub arch: String,
    /// Warp (wavefront) size, when the cache states it.
    pub warp_size: Option<u32>,
}

/// A cache image's self-description, from its labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheImage {
    /// Triton or vLLM.
    pub cache_type: CacheType,
    /// Number of cache entries.
    pub entry_count: Option<u64>,
    /// Bytes of cache content.
    pub size_bytes: Option<u64>,
    /// GPU targets.
    pub targets: Vec<Target>,
}

/// Why an image is not a usable kernel cache.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// Neither summary label is present.
    #[error(
        "not a kernel cache image: no cache.triton.image/summary or cache.vllm.image/summary label"
    )]
    NotACache,
    /// Both are present.
    #[error("ambiguous kernel cache image: both Triton and vLLM labels are present")]
    Ambiguous,
    /// A label does not parse.
    #[error("label {label}: {reason}")]
    BadLabel {
        /// The label.
        label: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The manifest does not parse.
    #[error("{path}: {reason}")]
    BadManifest {
        /// The manifest's path in the layer.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Read the labels of an image config blob (`config.Labels`).
pub fn labels_of_config(config: &Value) -> BTreeMap<String, String> {
    config
        .get("config")
        .and_then(|c| c.get("Labels"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// Read a cache image's labels.
pub fn from_labels(labels: &BTreeMap<String, String>) -> Result<CacheImage, ImageError> {
    let has = |t: CacheType| labels.contains_key(&format!("{}summary", t.label_prefix()));
    let cache_type = match (has(CacheType::Triton), has(CacheType::Vllm)) {
        (true, true) => return Err(ImageError::Ambiguous),
        (true, false) => CacheType::Triton,
        (false, true) => CacheType::Vllm,
        (false, false) => return Err(ImageError::NotACache),
    };
    let label = |name: &str| format!("{}{name}", cache_type.label_prefix());
    let number = |name: &str| -> Result<Option<u64>, ImageError> {
        labels
            .get(&label(name))
            .map(|v| {
                v.trim().parse::<u64>().map_err(|e| ImageError::BadLabel {
                    label: label(name),
                    reason: e.to_string(),
                })
            })
            .transpose()
    };
    let summary_label = label("summary");
    let summary: Value =
        serde_json::from_str(&labels[&summary_label]).map_err(|e| ImageError::BadLabel {
            label: summary_label.clone(),
            reason: format!("not JSON: {e}"),
        })?;
    let targets = summary
        .get("targets")
        .and_then(Value::as_array)
        .ok_or_else(|| ImageError::BadLabel {
            label: summary_label.clone(),
            reason: "no targets list".into(),
        })?
        .iter()
        .map(|t| {
            target(t).map_err(|reason| ImageError::BadLabel {
                label: summary_label.clone(),
                reason,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if targets.is_empty() {
        return Err(ImageError::BadLabel {
            label: summary_label,
            reason: "no targets".into(),
        });
    }
    Ok(CacheImage {
        cache_type,
        entry_count: number("entry-count")?,
        size_bytes: number("cache-size-bytes")?,
        targets,
    })
}

/// Targets listed in a layer manifest (`{"triton": [{backend, arch, warp_size, ...}]}`,
/// or MCV's vLLM manifest, whose `triton`-format entries list their kernels one level
/// down: `{"vllm": [{"cacheFormat": "triton", "triton": [{backend, ...}]}]}`): every
/// entry that names a backend, in the manifest's top-level lists or in the lists of
/// their entries. (vLLM binary entries name no GPU: none for those.)
pub fn manifest_targets(cache_type: CacheType, manifest: &[u8]) -> Result<Vec<Target>, ImageError> {
    let bad = |reason: String| ImageError::BadManifest {
        path: cache_type.manifest_path().into(),
        reason,
    };
    let value: Value =
        serde_json::from_slice(manifest).map_err(|e| bad(format!("not JSON: {e}")))?;
    let mut targets = Vec::new();
    for list in value
        .as_object()
        .into_iter()
        .flat_map(|o| o.values())
        .filter_map(Value::as_array)
    {
        let nested = list
            .iter()
            .filter(|e| e.get("backend").is_none())
            .filter_map(Value::as_object)
            .flat_map(|e| e.values())
            .filter_map(Value::as_array)
            .flatten();
        for entry in list
            .iter()
            .chain(nested)
            .filter(|e| e.get("backend").is_some())
        {
            let t = target(entry).map_err(bad)?;
            if !targets.contains(&t) {
                targets.push(t);
            }
        }
    }
    Ok(targets)
}

fn target(v: &Value) -> Result<Target, String> {
    let backend = v
        .get("backend")
        .and_then(Value::as_str)
        .ok_or("a target has no backend")?
        .to_ascii_lowercase();
    let arch = match v.get("arch") {
        Some(Value::String(s)) => normalize_arch(s),
        Some(Value::Number(n)) => n.to_string(),
        _ => return Err("a target has no arch".into()),
    };
    if arch.is_empty() {
        return Err("a target has an empty arch".into());
    }
    // MCV's Go code writes a missing warp size as 0 (`int`, not `omitempty`): unknown.
    let warp_size = match v.get("warp_size") {
        None | Some(Value::Null) => None,
        Some(w) if w.as_u64() == Some(0) => None,
        Some(w) => Some(
            w.as_u64()
                .and_then(|w| u32::try_from(w).ok())
                .ok_or("warp_size is not a small integer")?,
        ),
    };
    Ok(Target {
        backend,
        arch,
        warp_size,
    })
}

/// `sm_90` -> `90`; `gfx90a` stays.
pub fn normalize_arch(arch: &str) -> String {
    let a = arch.trim().to_ascii_lowercase();
    a.strip_prefix("sm_").map_or(a.clone(), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(path: &str) -> Vec<u8> {
        std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/data")
                .join(path),
        )
        .unwrap()
    }

    #[test]
    fn reads_the_real_rocm_cache_image_labels() {
        let config: Value =
            serde_json::from_slice(&example("triton-rocm-vector-add/image-config.json")).unwrap();
        let image = from_labels(&labels_of_config(&config)).unwrap();
        assert_eq!(image.cache_type, CacheType::Triton);
        assert_eq!(image.entry_count, Some(1));
        assert_eq!(image.size_bytes, Some(80415));
        assert_eq!(
            image.targets,
            [Target {
                backend: "hip".into(),
                arch: "gfx90a".into(),
                warp_size: Some(64)
            }]
        );
    }

    #[test]
    fn reads_the_real_manifest() {
        let targets = manifest_targets(
            CacheType::Triton,
            &example("triton-rocm-vector-add/io.triton.manifest/manifest.json"),
        )
        .unwrap();
        assert_eq!(
            targets,
            [Target {
                backend: "hip".into(),
                arch: "gfx90a".into(),
                warp_size: Some(64)
            }]
        );
    }

    #[test]
    fn mcvs_vllm_manifest_lists_triton_kernels_one_level_down() {
        let manifest = br#"{"vllm":[{"vllmHash":"a","cacheFormat":"triton","triton":[{"hash":"h","backend":"hip","arch":"gfx90a","warp_size":64}]},{"vllmHash":"b","cacheFormat":"binary","binary":[{"rank":"rank_0_0","prefix":"backbone"}]}]}"#;
        assert_eq!(
            manifest_targets(CacheType::Vllm, manifest).unwrap(),
            [Target {
                backend: "hip".into(),
                arch: "gfx90a".into(),
                warp_size: Some(64)
            }]
        );
    }

    #[test]
    fn vllm_summaries_with_sm_prefix_and_int_arch() {
        let labels: BTreeMap<String, String> = [
            ("cache.vllm.image/summary".to_string(), r#"{"targets":[{"backend":"CUDA","arch":"sm_90","warp_size":32},{"backend":"cuda","arch":80,"warp_size":0}]}"#.to_string()),
            ("cache.vllm.image/entry-count".to_string(), "12".to_string()),
        ]
        .into();
        let image = from_labels(&labels).unwrap();
        assert_eq!(image.cache_type, CacheType::Vllm);
        assert_eq!(
            image.targets[0],
            Target {
                backend: "cuda".into(),
                arch: "90".into(),
                warp_size: Some(32)
            }
        );
        assert_eq!(
            image.targets[1],
            Target {
                backend: "cuda".into(),
                arch: "80".into(),
                warp_size: None
            }
        );
    }

    #[test]
    fn wrong_labels_are_refused_clearly() {
        let none = BTreeMap::new();
        assert_eq!(from_labels(&none).unwrap_err(), ImageError::NotACache);
        let both: BTreeMap<String, String> = [
            ("cache.vllm.image/summary".to_string(), "{}".to_string()),
            ("cache.triton.image/summary".to_string(), "{}".to_string()),
        ]
        .into();
        assert_eq!(from_labels(&both).unwrap_err(), ImageError::Ambiguous);
        let not_json: BTreeMap<String, String> = [(
            "cache.triton.image/summary".to_string(),
            "targets: x".to_string(),
        )]
        .into();
        assert!(
            from_labels(&not_json)
                .unwrap_err()
                .to_string()
                .starts_with("label cache.triton.image/summary: not JSON")
        );
        let bad_count: BTreeMap<String, String> = [
            (
                "cache.triton.image/summary".to_string(),
                r#"{"targets":[{"backend":"cuda","arch":"90"}]}"#.to_string(),
            ),
            (
                "cache.triton.image/entry-count".to_string(),
                "many".to_string(),
            ),
        ]
        .into();
        assert!(
            matches!(from_labels(&bad_count).unwrap_err(), ImageError::BadLabel { label, .. } if label == "cache.triton.image/entry-count")
        );
        let no_arch: BTreeMap<String, String> = [(
            "cache.triton.image/summary".to_string(),
            r#"{"targets":[{"backend":"cuda"}]}"#.to_string(),
        )]
        .into();
        assert_eq!(
            from_labels(&no_arch).unwrap_err().to_string(),
            "label cache.triton.image/summary: a target has no arch"
        );
    }
}

/// The property target for image labels and layer manifests: whatever a registry puts
/// there, reading them gives a clear error or a description whose targets all name a
/// lowercase backend and a non-empty arch; never a panic. Cases: `PROPTEST_CASES`.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn json_text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(r#"{"targets":[{"backend":"CUDA","arch":"sm_90","warp_size":32}]}"#.to_string()),
            Just(r#"{"targets":[]}"#.to_string()),
            Just(r#"{"targets":[{"backend":"hip","arch":90,"warp_size":-1}]}"#.to_string()),
            Just(r#"{"targets":[{"backend":1,"arch":"x"}]}"#.to_string()),
            Just(r#"{"targets":{"backend":"cuda"}}"#.to_string()),
            Just(r#"{"triton":[{"backend":"cuda","arch":" "}],"x":[1,"a",null]}"#.to_string()),
            ".{0,40}",
        ]
    }

    proptest! {
        #[test]
        fn labels_give_a_cache_or_a_clear_error(
            entries in proptest::collection::vec((
                prop_oneof![
                    Just("cache.triton.image/summary".to_string()),
                    Just("cache.vllm.image/summary".to_string()),
                    Just("cache.triton.image/entry-count".to_string()),
                    Just("cache.triton.image/cache-size-bytes".to_string()),
                    Just("cache.vllm.image/cache-size-bytes".to_string()),
                    ".{0,12}",
                ],
                json_text(),
            ), 0..5)
        ) {
            let labels: BTreeMap<String, String> = entries.into_iter().collect();
            match from_labels(&labels) {
                Ok(image) => {
                    prop_assert!(!image.targets.is_empty());
                    for t in &image.targets {
                        prop_assert!(!t.arch.is_empty());
                        prop_assert_eq!(&t.backend, &t.backend.to_ascii_lowercase());
                    }
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }

        #[test]
        fn manifests_give_targets_or_a_clear_error(text in json_text(), bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            for input in [text.as_bytes(), &bytes[..]] {
                for t in [CacheType::Triton, CacheType::Vllm] {
                    match manifest_targets(t, input) {
                        Ok(targets) => prop_assert!(targets.iter().all(|t| !t.arch.is_empty())),
                        Err(e) => prop_assert!(e.to_string().starts_with(t.manifest_path())),
                    }
                }
            }
        }
    }
}
