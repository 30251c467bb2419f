//! Which GPUs this node has: from NVML (the NVIDIA driver's management library, loaded at
//! run time) or from an inventory file (tests, and nodes whose GPUs NVML cannot see).
//!
//! Finding no GPU is a normal state, never an error: no library, a failed initialisation
//! or zero devices give an empty list and a message saying why.

use std::path::Path;

use serde::Deserialize;

use kubeairunway_kernelcache_api::GpuInfo;
use kubeairunway_kernelcache_artifact::compat::cuda_arch;
use kubeairunway_kernelcache_artifact::image::normalize_arch;

/// What detection found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Detected {
    /// The GPUs, by index.
    pub gpus: Vec<GpuInfo>,
    /// Why none were found (or what went wrong with some), for `status.gpuDetection`.
    pub message: Option<String>,
}

/// A way to find the node's GPUs.
pub trait GpuSource: Send + Sync {
    /// The GPUs now.
    fn detect(&self) -> Detected;
}

/// NVIDIA GPUs through NVML (`libnvidia-ml.so.1`, as the NVIDIA container toolkit mounts
/// it; `libnvidia-ml.so` as a fallback).
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvml;

impl GpuSource for Nvml {
    fn detect(&self) -> Detected {
        let nvml = match nvml_wrapper::Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init()
            .or_else(|_| nvml_wrapper::Nvml::init())
        {
            Ok(nvml) => nvml,
            Err(e) => {
                return Detected {
                    gpus: Vec::new(),
                    message: Some(format!("NVIDIA management library unavailable: {e}")),
                };
            }
        };
        let count = match nvml.device_count() {
            Ok(n) => n,
            Err(e) => {
                return Detected {
                    gpus: Vec::new(),
                    message: Some(format!("counting NVIDIA GPUs failed: {e}")),
                };
            }
        };
        let driver = nvml.sys_driver_version().ok();
        let mut gpus = Vec::new();
        let mut problems = Vec::new();
        for index in 0..count {
            let found = nvml.device_by_index(index).and_then(|device| {
                let cc = device.cuda_compute_capability()?;
                Ok((device.name().ok(), cc.major, cc.minor))
            });
            match found {
                Ok((name, major, minor)) => {
                    gpus.push(nvidia_gpu(index, name, major, minor, driver.clone()));
                }
                Err(e) => problems.push(format!("GPU {index}: {e}")),
            }
        }
        let message = if gpus.is_empty() && problems.is_empty() {
            Some("no NVIDIA GPUs found (NVML reports 0 devices)".to_string())
        } else if problems.is_empty() {
            None
        } else {
            Some(format!(
                "some GPUs could not be read: {}",
                problems.join("; ")
            ))
        };
        Detected { gpus, message }
    }
}

/// A CUDA GPU as caches name it: backend `cuda`, arch `major*10+minor`, warp size 32.
pub fn nvidia_gpu(
    index: u32,
    name: Option<String>,
    major: i32,
    minor: i32,
    driver_version: Option<String>,
) -> GpuInfo {
    GpuInfo {
        index: i32::try_from(index).unwrap_or(i32::MAX),
        name,
        backend: "cuda".into(),
        arch: cuda_arch(major.unsigned_abs(), minor.unsigned_abs()),
        warp_size: 32,
        driver_version,
    }
}

/// A fixed inventory, e.g. read from a file with [`Static::from_file`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Static(pub Detected);

impl GpuSource for Static {
    fn detect(&self) -> Detected {
        self.0.clone()
    }
}

/// One GPU of an inventory file.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct InventoryGpu {
    index: Option<i32>,
    name: Option<String>,
    backend: String,
    arch: String,
    warp_size: Option<i32>,
    driver_version: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InventoryObject {
    gpus: Vec<InventoryGpu>,
    #[serde(default)]
    message: Option<String>,
}

impl Static {
    /// Parse an inventory (YAML or JSON): a list of GPUs, or `{gpus: [...], message}`.
    /// Each GPU has `backend` (`cuda`, `hip`) and `arch` (CUDA `90`, `sm_90` or `9.0`; HIP
    /// `gfx90a`), and optionally `index` (default: position), `name`, `warpSize` (default
    /// 32 for CUDA, 64 for HIP) and `driverVersion`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| format!("GPU inventory: {e}"))?;
        let (gpus, message) = if value.is_array() {
            (serde_json::from_value(value), None)
        } else {
            match serde_json::from_value::<InventoryObject>(value) {
                Ok(o) => (Ok(o.gpus), o.message),
                Err(e) => (Err(e), None),
            }
        };
        let gpus: Vec<InventoryGpu> = gpus.map_err(|e| format!("GPU inventory: {e}"))?;
        let mut out = Vec::new();
        for (position, gpu) in gpus.into_iter().enumerate() {
            let backend = gpu.backend.trim().to_ascii_lowercase();
            let arch = arch(&backend, &gpu.arch)
                .ok_or_else(|| format!("GPU inventory: GPU {position}: arch is empty"))?;
            let warp_size = match (gpu.warp_size, backend.as_str()) {
                (Some(w), _) if w > 0 => w,
                (Some(w), _) => {
                    return Err(format!(
                        "GPU inventory: GPU {position}: warpSize {w} is not positive"
                    ));
                }
                (None, "cuda") => 32,
                (None, "hip") => 64,
                (None, other) => {
                    return Err(format!(
                        "GPU inventory: GPU {position}: warpSize is needed for backend {other:?}"
                    ));
                }
            };
            out.push(GpuInfo {
                index: gpu
                    .index
                    .unwrap_or_else(|| i32::try_from(position).unwrap_or(i32::MAX)),
                name: gpu.name,
                backend,
                arch,
                warp_size,
                driver_version: gpu.driver_version,
            });
        }
        let message = message.or_else(|| {
            out.is_empty()
                .then(|| "no GPUs in the GPU inventory".to_string())
        });
        Ok(Self(Detected { gpus: out, message }))
    }

    /// Read and parse an inventory file.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading GPU inventory {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// An inventory arch as caches name it: CUDA `9.0` -> `90`, `sm_90` -> `90`.
fn arch(backend: &str, arch: &str) -> Option<String> {
    let a = normalize_arch(arch);
    if a.is_empty() {
        return None;
    }
    if backend == "cuda"
        && let Some((major, minor)) = a.split_once('.')
        && let (Ok(major), Ok(minor)) = (major.parse::<u32>(), minor.parse::<u32>())
    {
        return Some(cuda_arch(major, minor));
    }
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inventory_list_fills_in_indices_and_warp_sizes() {
        let s = Static::parse(
            r#"
- name: NVIDIA H100 80GB HBM3
  backend: cuda
  arch: "9.0"
- backend: CUDA
  arch: sm_80
- index: 7
  name: AMD Instinct MI210
  backend: hip
  arch: gfx90a
"#,
        )
        .unwrap();
        let gpus = s.detect().gpus;
        assert_eq!(
            gpus.iter()
                .map(|g| (g.index, g.backend.as_str(), g.arch.as_str(), g.warp_size))
                .collect::<Vec<_>>(),
            [
                (0, "cuda", "90", 32),
                (1, "cuda", "80", 32),
                (7, "hip", "gfx90a", 64)
            ]
        );
        assert_eq!(gpus[0].name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(s.detect().message, None);
    }

    #[test]
    fn an_inventory_object_in_json_with_no_gpus_says_why() {
        let s = Static::parse(r#"{"gpus": [], "message": "lab node without GPUs"}"#).unwrap();
        assert_eq!(s.0.gpus, []);
        assert_eq!(s.0.message.as_deref(), Some("lab node without GPUs"));
        let empty = Static::parse("[]").unwrap();
        assert_eq!(
            empty.0.message.as_deref(),
            Some("no GPUs in the GPU inventory")
        );
    }

    #[test]
    fn bad_inventories_are_refused_clearly() {
        let unknown = Static::parse("[{backend: cuda, arch: '90', warp: 32}]").unwrap_err();
        assert!(unknown.contains("warp"), "{unknown}");
        let no_warp = Static::parse("[{backend: metal, arch: m3}]").unwrap_err();
        assert_eq!(
            no_warp,
            "GPU inventory: GPU 0: warpSize is needed for backend \"metal\""
        );
        let empty_arch = Static::parse("[{backend: cuda, arch: ''}]").unwrap_err();
        assert_eq!(empty_arch, "GPU inventory: GPU 0: arch is empty");
        assert!(Static::parse("gpus: 3").is_err());
    }

    #[test]
    fn nvidia_gpus_are_cuda_with_major_minor_arch_and_warp_32() {
        let g = nvidia_gpu(1, Some("NVIDIA A100".into()), 8, 0, Some("550.54".into()));
        assert_eq!(
            (g.index, g.backend.as_str(), g.arch.as_str(), g.warp_size),
            (1, "cuda", "80", 32)
        );
        assert_eq!(nvidia_gpu(0, None, 12, 1, None).arch, "121");
    }

    #[test]
    fn nvml_without_the_library_is_an_empty_list_with_a_message() {
        // This machine has no NVIDIA driver: detection must report, not fail.
        if Path::new("/dev/nvidiactl").exists() {
            return;
        }
        let d = Nvml.detect();
        assert!(d.gpus.is_empty());
        assert!(d.message.is_some_and(|m| m.contains("NVIDIA")));
    }
}
