//! Does a cache fit a GPU? Per GPU: same backend, same architecture, same warp size.
//!
//! Triton and torch.compile caches hold machine code for one architecture (CUDA cubins
//! for one `sm_XY`, HIP code objects for one `gfx...`), so the architecture must match
//! exactly.

use crate::image::{Target, normalize_arch};
use kubeairunway_kernelcache_api::{GpuInfo, IncompatibleGpu};

/// `major*10+minor` of a CUDA compute capability, as caches name architectures (9.0 ->
/// `90`).
pub fn cuda_arch(major: u32, minor: u32) -> String {
    (major * 10 + minor).to_string()
}

/// Per-GPU decision: the indices of GPUs the cache fits, and why it fits none of the
/// others.
pub fn decide(targets: &[Target], gpus: &[GpuInfo]) -> (Vec<i32>, Vec<IncompatibleGpu>) {
    let mut compatible = Vec::new();
    let mut incompatible = Vec::new();
    for gpu in gpus {
        match fits(targets, gpu) {
            Ok(()) => compatible.push(gpu.index),
            Err((reason, message)) => incompatible.push(IncompatibleGpu {
                index: gpu.index,
                reason: reason.into(),
                message,
            }),
        }
    }
    (compatible, incompatible)
}

fn fits(targets: &[Target], gpu: &GpuInfo) -> Result<(), (&'static str, String)> {
    let backend = gpu.backend.to_ascii_lowercase();
    let arch = normalize_arch(&gpu.arch);
    let name = gpu.name.as_deref().unwrap_or("GPU");
    let same_backend: Vec<&Target> = targets.iter().filter(|t| t.backend == backend).collect();
    if same_backend.is_empty() {
        return Err((
            "BackendMismatch",
            format!(
                "cache built for {}; GPU {} ({name}) is {backend}",
                list(targets.iter().map(|t| t.backend.as_str())),
                gpu.index
            ),
        ));
    }
    let same_arch: Vec<&&Target> = same_backend.iter().filter(|t| t.arch == arch).collect();
    if same_arch.is_empty() {
        return Err((
            "ArchMismatch",
            format!(
                "cache built for {backend} arch {}; GPU {} ({name}) is {arch}",
                list(same_backend.iter().map(|t| t.arch.as_str())),
                gpu.index
            ),
        ));
    }
    let warp = u32::try_from(gpu.warp_size).ok();
    if same_arch
        .iter()
        .any(|t| t.warp_size.is_none() || t.warp_size == warp)
    {
        Ok(())
    } else {
        Err((
            "WarpSizeMismatch",
            format!(
                "cache built for warp size {}; GPU {} ({name}) has {}",
                list(
                    same_arch
                        .iter()
                        .filter_map(|t| t.warp_size)
                        .map(|w| w.to_string())
                        .collect::<Vec<_>>()
                        .iter()
                        .map(String::as_str)
                ),
                gpu.index,
                gpu.warp_size
            ),
        ))
    }
}

fn list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let mut v: Vec<&str> = items.collect();
    v.sort_unstable();
    v.dedup();
    v.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: i32, name: &str, backend: &str, arch: &str, warp: i32) -> GpuInfo {
        GpuInfo {
            index,
            name: Some(name.into()),
            backend: backend.into(),
            arch: arch.into(),
            warp_size: warp,
            driver_version: None,
        }
    }

    fn h100(i: i32) -> GpuInfo {
        gpu(i, "NVIDIA H100 80GB HBM3", "cuda", &cuda_arch(9, 0), 32)
    }
    fn a100(i: i32) -> GpuInfo {
        gpu(i, "NVIDIA A100-SXM4-80GB", "cuda", &cuda_arch(8, 0), 32)
    }
    fn mi210(i: i32) -> GpuInfo {
        gpu(i, "AMD Instinct MI210", "hip", "gfx90a", 64)
    }

    fn t(backend: &str, arch: &str, warp: Option<u32>) -> Target {
        Target {
            backend: backend.into(),
            arch: arch.into(),
            warp_size: warp,
        }
    }

    #[test]
    fn the_rocm_example_fits_only_gfx90a() {
        let rocm = [t("hip", "gfx90a", Some(64))];
        let (ok, no) = decide(&rocm, &[mi210(0), h100(1)]);
        assert_eq!(ok, [0]);
        assert_eq!(no[0].index, 1);
        assert_eq!(no[0].reason, "BackendMismatch");
        assert_eq!(
            no[0].message,
            "cache built for hip; GPU 1 (NVIDIA H100 80GB HBM3) is cuda"
        );
    }

    #[test]
    fn the_cuda_sm75_example_fits_neither_h100_nor_a100() {
        let sm75 = [t("cuda", "75", Some(32))];
        let (ok, no) = decide(&sm75, &[h100(0), a100(1)]);
        assert!(ok.is_empty());
        assert_eq!(
            no.iter().map(|n| n.reason.as_str()).collect::<Vec<_>>(),
            ["ArchMismatch", "ArchMismatch"]
        );
        assert_eq!(
            no[0].message,
            "cache built for cuda arch 75; GPU 0 (NVIDIA H100 80GB HBM3) is 90"
        );
    }

    #[test]
    fn a_multi_target_cache_fits_each_listed_arch_on_a_mixed_node() {
        let both = [t("cuda", "90", Some(32)), t("cuda", "80", None)];
        let (ok, no) = decide(&both, &[h100(0), a100(1), mi210(2)]);
        assert_eq!(ok, [0, 1]);
        assert_eq!(no.len(), 1);
        assert_eq!(no[0].index, 2);
    }

    #[test]
    fn warp_size_must_match_when_stated() {
        let odd = [t("hip", "gfx90a", Some(32))];
        let (ok, no) = decide(&odd, &[mi210(0)]);
        assert!(ok.is_empty());
        assert_eq!(no[0].reason, "WarpSizeMismatch");
        assert_eq!(
            no[0].message,
            "cache built for warp size 32; GPU 0 (AMD Instinct MI210) has 64"
        );
    }

    #[test]
    fn no_gpus_means_no_decisions() {
        let (ok, no) = decide(&[t("cuda", "90", Some(32))], &[]);
        assert!(ok.is_empty() && no.is_empty());
    }

    #[test]
    fn sm_prefixed_gpu_arch_is_normalized() {
        let (ok, _) = decide(
            &[t("cuda", "90", None)],
            &[gpu(0, "H100", "CUDA", "sm_90", 32)],
        );
        assert_eq!(ok, [0]);
    }
}
