//! What a vLLM cache root (`VLLM_CACHE_ROOT`) holds, listed as MCV lists it in a cache
//! image's `io.vllm.manifest/manifest.json`, so that MCV's and GKM's readers accept the
//! images `kubeairunway cache build` makes. MCV's create (`DetectVLLMCache`,
//! `mcv/pkg/cache/vllm.go@f0e65de4` of redhat-et/GKM) walks
//! `torch_compile_cache/`:
//!
//! - each hash directory (other than `torch_aot_compile/`) is one entry: `binary` when a
//!   `rank_<r>_<d>/<prefix>/` holds `cache_key_factors.json` and `artifact_compile_range_*`
//!   artifacts (one record per prefix), else `triton` when a `triton_cache/` below it
//!   holds Triton kernels (their MCV manifest entries), else it is counted but not listed;
//! - `torch_aot_compile/<hash>/rank_<r>_<d>/model` files are mega-AOT entries (format
//!   `binary`, save format `mega-aot`), one per hash directory holding any.
//!
//! The manifest is `{"vllm": [{"vllmHash", "cacheFormat", "binary"|"triton": [...]}]}`
//! (`VLLMCacheMetadata`, field names and omissions as Go's `encoding/json` writes them);
//! MCV's reader (`mcv/pkg/preflightcheck/vllm.go@f0e65de4`) refuses an entry of any
//! other `cacheFormat`. The `cache.vllm.image/format` label names the formats present;
//! the `io.kserve.km/*` labels are the hints MCV adds for KServe's kernel manager.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::error::BuildError;

const AOT_DIR: &str = "torch_aot_compile";
/// The save format MCV gives mega-AOT bundles.
const MEGA_AOT: &str = "mega-aot";

/// The entries of a vLLM cache root's manifest, and how many cache entries MCV counts
/// (the `cache.vllm.image/entry-count` label).
#[derive(Clone, Debug, PartialEq)]
pub struct Listed {
    /// `VLLMCacheMetadata` records.
    pub entries: Vec<Value>,
    /// Hash directories counted.
    pub count: usize,
}

impl Listed {
    /// The `cache.vllm.image/format` label: the formats present in MCV's order
    /// (`aot_compile`, `binary`, `triton`), comma-separated, or `unpacked` when none is.
    pub fn format(&self) -> String {
        let formats: Vec<&str> = ["aot_compile", "binary", "triton"]
            .into_iter()
            .filter(|f| self.entries.iter().any(|e| e["cacheFormat"] == *f))
            .collect();
        if formats.is_empty() {
            "unpacked".into()
        } else {
            formats.join(",")
        }
    }

    /// The KServe kernel-manager hints MCV's create adds to a vLLM cache image
    /// (`VLLMCache.Labels`): the framework and cache type, the hashes listed (first seen
    /// first), the subpath to mount (`torch_compile_cache`, or its `torch_aot_compile/`
    /// when the first hash is an AOT one) and the cache root variable at KServe's path.
    /// None when nothing is listed.
    pub fn kserve_labels(&self) -> Vec<(String, String)> {
        let mut hashes: Vec<&str> = Vec::new();
        for hash in self.entries.iter().filter_map(|e| e["vllmHash"].as_str()) {
            if !hash.is_empty() && !hashes.contains(&hash) {
                hashes.push(hash);
            }
        }
        let Some(first) = hashes.first() else {
            return Vec::new();
        };
        let first = self
            .entries
            .iter()
            .find(|e| e["vllmHash"] == *first)
            .unwrap_or(&Value::Null);
        let aot = first["cacheFormat"] == "aot_compile"
            || first["binary"]
                .as_array()
                .is_some_and(|b| b.iter().any(|r| r["cache_save_format"] == MEGA_AOT));
        let subpath = if aot {
            format!("torch_compile_cache/{AOT_DIR}")
        } else {
            "torch_compile_cache".into()
        };
        [
            ("framework", "vllm".to_string()),
            ("cache-type", "torch-compile".into()),
            ("cache-hash", hashes.join(",")),
            ("cache-mount-subpath", subpath),
            (
                "cache-root-env",
                "VLLM_CACHE_ROOT=/home/kserve/.cache/vllm".into(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (format!("io.kserve.km/{k}"), v))
        .collect()
    }

    /// The manifest document.
    pub fn manifest(&self) -> Value {
        json!({"vllm": self.entries})
    }
}

/// List the vLLM cache root `root`; `triton_entries` gives the MCV manifest entries of
/// the Triton kernels below a directory.
pub fn list(
    root: &Path,
    triton_entries: impl Fn(&Path) -> Result<Vec<Value>, BuildError>,
) -> Result<Listed, BuildError> {
    let compile = root.join("torch_compile_cache");
    let mut listed = Listed {
        entries: Vec::new(),
        count: 0,
    };
    for (name, dir) in dirs(&compile)? {
        if name == AOT_DIR {
            continue;
        }
        listed.count += 1;
        let binary = binary(&dir)?;
        if !binary.is_empty() {
            listed
                .entries
                .push(json!({"vllmHash": name, "cacheFormat": "binary", "binary": binary}));
        } else if let Some(triton) = find_dir(&dir, "triton_cache")? {
            let kernels = triton_entries(&triton)?;
            if !kernels.is_empty() {
                listed
                    .entries
                    .push(json!({"vllmHash": name, "cacheFormat": "triton", "triton": kernels}));
            }
        }
    }
    for (name, dir) in dirs(&compile.join(AOT_DIR))? {
        let models: Vec<Value> = dirs(&dir)?
            .into_iter()
            .filter(|(rank, path)| is_rank(rank) && path.join("model").is_file())
            .map(|(rank, _)| {
                json!({"rank": rank, "prefix": "", "artifact_count": 1,
                    "artifact_names": ["model"], "cache_save_format": MEGA_AOT})
            })
            .collect();
        if !models.is_empty() {
            listed.count += 1;
            listed
                .entries
                .push(json!({"vllmHash": name, "cacheFormat": "binary", "binary": models}));
        }
    }
    Ok(listed)
}

/// The binary-cache records of a hash directory (`detectBinaryCache`): one per
/// `rank_<r>_<d>/<prefix>/` with a readable `cache_key_factors.json` and artifacts.
fn binary(hash_dir: &Path) -> Result<Vec<Value>, BuildError> {
    let mut out = Vec::new();
    for (rank, rank_dir) in dirs(hash_dir)? {
        if !is_rank(&rank) {
            continue;
        }
        for (prefix, prefix_dir) in dirs(&rank_dir)? {
            let Ok(bytes) = kubeairunway_kernelcache_artifact::files::read_bounded(
                &prefix_dir.join("cache_key_factors.json"),
                16 << 20,
            ) else {
                continue;
            };
            let Ok(factors) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            let artifacts: Vec<(String, bool)> = entries(&prefix_dir)?
                .into_iter()
                .filter(|(n, _)| n.starts_with("artifact_compile_range_"))
                .map(|(n, p)| (n, p.is_dir()))
                .collect();
            let Some((_, first_is_dir)) = artifacts.first() else {
                continue;
            };
            let mut record = Map::new();
            record.insert("rank".into(), json!(rank));
            record.insert("prefix".into(), json!(prefix));
            record.insert("artifact_count".into(), json!(artifacts.len()));
            record.insert(
                "artifact_names".into(),
                json!(artifacts.iter().map(|(n, _)| n).collect::<Vec<_>>()),
            );
            // Go omits empty strings and maps of `omitempty` fields.
            for (field, key) in [
                ("code_hash", "code_hash"),
                ("config_hash", "config_hash"),
                ("compiler_hash", "compiler_hash"),
            ] {
                if let Some(v) = factors[key].as_str().filter(|v| !v.is_empty()) {
                    record.insert(field.into(), json!(v));
                }
            }
            record.insert(
                "cache_save_format".into(),
                json!(if *first_is_dir { "unpacked" } else { "binary" }),
            );
            if let Some(device) = factors["env"]["VLLM_TARGET_DEVICE"]
                .as_str()
                .filter(|d| !d.is_empty())
            {
                record.insert("target_device".into(), json!(device));
            }
            if let Some(env) = factors["env"].as_object().filter(|e| !e.is_empty()) {
                record.insert("env".into(), Value::Object(env.clone()));
            }
            out.push(Value::Object(record));
        }
    }
    Ok(out)
}

/// `rank_<r>_<d>`.
fn is_rank(name: &str) -> bool {
    let mut parts = name.split('_');
    parts.next() == Some("rank")
        && parts.clone().count() == 2
        && parts.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The first directory named `name` below `dir` (depth first, in name order).
fn find_dir(dir: &Path, name: &str) -> Result<Option<PathBuf>, BuildError> {
    for (n, path) in dirs(dir)? {
        if n == name {
            return Ok(Some(path));
        }
        if let Some(found) = find_dir(&path, name)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// The entries of `dir` (name, path), in name order; none when it does not exist.
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf)>, BuildError> {
    let read = match fs::read_dir(dir) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(BuildError::Io {
                context: format!("reading {}", dir.display()),
                source,
            });
        }
    };
    let mut out: Vec<(String, PathBuf)> = read
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    out.sort();
    Ok(out)
}

/// The subdirectories of `dir` (links are not followed), in name order.
fn dirs(dir: &Path) -> Result<Vec<(String, PathBuf)>, BuildError> {
    Ok(entries(dir)?
        .into_iter()
        .filter(|(_, p)| p.symlink_metadata().is_ok_and(|m| m.is_dir()))
        .collect())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn write(root: &Path, rel: &str, data: &[u8]) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, data).unwrap();
    }

    #[test]
    fn the_real_binary_cache_is_one_binary_entry() {
        let root = tempfile::tempdir().unwrap();
        let factors = fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/data/vllm-llama-binary/cache_key_factors.json"),
        )
        .unwrap();
        let backbone = "torch_compile_cache/edf531ca35/rank_0_0/backbone";
        write(
            root.path(),
            &format!("{backbone}/cache_key_factors.json"),
            &factors,
        );
        for n in [1, 0] {
            write(
                root.path(),
                &format!("{backbone}/artifact_compile_range_1_2048_subgraph_{n}"),
                b"x",
            );
        }
        write(
            root.path(),
            &format!("{backbone}/vllm_compile_cache.py"),
            b"{}",
        );
        let listed = list(root.path(), |_| Ok(Vec::new())).unwrap();
        assert_eq!(listed.count, 1);
        assert_eq!(listed.format(), "binary");
        let entry = &listed.entries[0];
        assert_eq!(entry["vllmHash"], "edf531ca35");
        assert_eq!(entry["cacheFormat"], "binary");
        let record = &entry["binary"][0];
        assert_eq!(record["rank"], "rank_0_0");
        assert_eq!(record["prefix"], "backbone");
        assert_eq!(record["artifact_count"], 2);
        assert_eq!(
            record["artifact_names"],
            json!([
                "artifact_compile_range_1_2048_subgraph_0",
                "artifact_compile_range_1_2048_subgraph_1"
            ])
        );
        assert_eq!(record["cache_save_format"], "binary");
        assert_eq!(record["compiler_hash"], "4fc2f2ae9e");
        assert_eq!(record["env"]["VLLM_COMPILE_CACHE_SAVE_FORMAT"], "binary");
        assert_eq!(listed.manifest()["vllm"][0], *entry);
        assert_eq!(
            listed.kserve_labels(),
            [
                ("io.kserve.km/framework", "vllm"),
                ("io.kserve.km/cache-type", "torch-compile"),
                ("io.kserve.km/cache-hash", "edf531ca35"),
                ("io.kserve.km/cache-mount-subpath", "torch_compile_cache"),
                (
                    "io.kserve.km/cache-root-env",
                    "VLLM_CACHE_ROOT=/home/kserve/.cache/vllm"
                ),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
    }

    #[test]
    fn triton_and_mega_aot_entries_and_unlisted_hashes() {
        let root = tempfile::tempdir().unwrap();
        write(
            root.path(),
            "torch_compile_cache/aaaa/rank_0_0/triton_cache/K/k.json",
            b"{}",
        );
        write(root.path(), "torch_compile_cache/bbbb/rank_0_0/x.py", b"");
        write(
            root.path(),
            "torch_compile_cache/torch_aot_compile/cccc/rank_0_0/model",
            b"m",
        );
        write(
            root.path(),
            "torch_compile_cache/torch_aot_compile/dddd/rank_x/model",
            b"m",
        );
        let kernels = |dir: &Path| -> Result<Vec<Value>, BuildError> {
            assert!(dir.ends_with("aaaa/rank_0_0/triton_cache"), "{dir:?}");
            Ok(vec![json!({"hash": "h", "backend": "cuda", "arch": "90"})])
        };
        let listed = list(root.path(), kernels).unwrap();
        // aaaa and bbbb (counted, not listed) and cccc; dddd has no rank directory.
        assert_eq!(listed.count, 3);
        assert_eq!(listed.format(), "binary,triton");
        assert_eq!(listed.entries[0]["cacheFormat"], "triton");
        assert_eq!(listed.entries[0]["triton"][0]["arch"], "90");
        assert_eq!(listed.entries[1]["vllmHash"], "cccc");
        assert_eq!(
            listed.entries[1]["binary"][0]["cache_save_format"],
            MEGA_AOT
        );
        assert_eq!(listed.entries.len(), 2);
        let hints: BTreeMap<String, String> = listed.kserve_labels().into_iter().collect();
        assert_eq!(hints["io.kserve.km/cache-hash"], "aaaa,cccc");
        assert_eq!(
            hints["io.kserve.km/cache-mount-subpath"],
            "torch_compile_cache"
        );
        let aot_only = Listed {
            entries: listed.entries[1..].to_vec(),
            count: 1,
        };
        let hints: BTreeMap<String, String> = aot_only.kserve_labels().into_iter().collect();
        assert_eq!(
            hints["io.kserve.km/cache-mount-subpath"],
            "torch_compile_cache/torch_aot_compile"
        );
        let empty = tempfile::tempdir().unwrap();
        let none = list(empty.path(), |_| Ok(Vec::new())).unwrap();
        assert_eq!((none.count, none.format().as_str()), (0, "unpacked"));
        assert!(none.kserve_labels().is_empty());
    }

    #[test]
    fn rank_directories() {
        assert!(is_rank("rank_0_0") && is_rank("rank_12_3"));
        assert!(!is_rank("rank_0") && !is_rank("rank_0_0_0") && !is_rank("rank_a_0"));
        assert!(!is_rank("rank__0") && !is_rank("backbone"));
    }
}
