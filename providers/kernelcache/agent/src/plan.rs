//! What this node should do, decided without I/O: which caches it wants (usable, and
//! selected by their `nodeSelector`), which of them fit its GPUs, what to inspect, what
//! to stage, what to delete from disk, and the state to report for each.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use kube::ResourceExt;

use kubeairunway_kernelcache_api::names;
use kubeairunway_kernelcache_api::{CacheState, GpuInfo, IncompatibleGpu, KernelCache, selects};
use kubeairunway_kernelcache_artifact::compat;
use kubeairunway_kernelcache_artifact::image::Target;

/// One digest of one KernelCache on this node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// Namespace of the KernelCache.
    pub namespace: String,
    /// Name of the KernelCache.
    pub name: String,
    /// The digest (`sha256:...`).
    pub digest: String,
}

impl Key {
    /// `<root>/<namespace>/<name>/<digest with ':' replaced by '-'>`, where
    /// [`kubeairunway_kernelcache_artifact::oci::Puller::stage`] puts it.
    pub fn dir(&self, root: &Path) -> PathBuf {
        root.join(&self.namespace)
            .join(&self.name)
            .join(self.digest.replace(':', "-"))
    }
}

impl Key {
    /// A key written as `<namespace>/<name>@<digest>` (as [`Key`] displays), if it is one.
    pub fn parse(s: &str) -> Option<Key> {
        let (namespace, rest) = s.split_once('/')?;
        let (name, digest) = rest.split_once('@')?;
        (!namespace.is_empty() && !name.is_empty() && valid_digest(digest)).then(|| Key {
            namespace: namespace.into(),
            name: name.into(),
            digest: digest.into(),
        })
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{}", self.namespace, self.name, self.digest)
    }
}

/// A cache digest this node wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// Which.
    pub key: Key,
    /// The pinned image (`repo@digest`), the only thing ever pulled.
    pub pinned: String,
    /// Where pods see a Triton cache (group files are rewritten to it).
    pub triton_mount: String,
    /// Image pull Secrets, in the KernelCache's namespace.
    pub pull_secrets: Vec<String>,
    /// Why it cannot be staged at all (reported as `Failed`).
    pub problem: Option<String>,
}

/// Where pods see the Triton cache of `cache` (`names::triton_dir`).
pub fn triton_mount(cache: &KernelCache) -> String {
    names::triton_dir(
        &cache.name_any(),
        cache.spec.mount.as_ref().and_then(|m| m.path.as_deref()),
    )
}

/// The caches this node wants: a usable image (`status.usable_image()`) and a
/// `nodeSelector` that selects the node. Nothing else is ever pulled. With the node's
/// labels unknown (`Err` with the reason), a cache with a `nodeSelector` is reported
/// `Failed` with that reason and not staged.
pub fn wanted<'a>(
    caches: impl IntoIterator<Item = &'a KernelCache>,
    node_labels: Result<&BTreeMap<String, String>, &String>,
) -> Vec<Wanted> {
    let mut out = Vec::new();
    for cache in caches {
        let Some(status) = &cache.status else {
            continue;
        };
        let (Some(pinned), Some(digest)) = (status.usable_image(), &status.resolved_digest) else {
            continue;
        };
        if cache.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let mut problem = None;
        match (node_labels, cache.spec.node_selector.as_ref()) {
            (Ok(labels), selector) if !selects(selector, labels) => continue,
            (Err(why), Some(_)) => {
                problem = Some(format!(
                    "nodeSelector not evaluated: this node's labels are unknown ({why})"
                ));
            }
            _ => {}
        }
        if !valid_digest(digest) {
            problem = Some(format!(
                "resolved digest {digest:?} is not an algorithm:hex digest; not staged"
            ));
        }
        out.push(Wanted {
            key: Key {
                namespace: cache.namespace().unwrap_or_default(),
                name: cache.name_any(),
                digest: digest.clone(),
            },
            pinned: pinned.to_string(),
            triton_mount: triton_mount(cache),
            pull_secrets: cache.spec.image_pull_secrets.clone(),
            problem,
        });
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// `sha256:<hex>` and the like: safe as a directory name.
pub fn valid_digest(digest: &str) -> bool {
    digest.split_once(':').is_some_and(|(algorithm, hex)| {
        !algorithm.is_empty()
            && algorithm
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && hex.len() >= 32
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// A complete cache directory found on disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OnDisk {
    /// Targets its manifest lists (may be empty).
    pub targets: Vec<Target>,
    /// Bytes of its files.
    pub size_bytes: u64,
}

/// Work under way for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busy {
    /// Reading the image's labels.
    Inspecting,
    /// Pulling, verifying and extracting.
    Staging,
}

/// Why the stage of `key` waits, if it does, given the work under way (`busy`): one
/// download per digest (a second cache of it waits, then links to the first), and at most
/// `parallel_stages` stages at once.
pub fn stage_wait(busy: &BTreeMap<Key, Busy>, key: &Key, parallel_stages: usize) -> Option<String> {
    if let Some((other, _)) = busy
        .iter()
        .find(|(k, b)| **b == Busy::Staging && k.digest == key.digest)
    {
        return Some(format!(
            "waiting for {other}, the same digest, to be staged"
        ));
    }
    let staging = busy.values().filter(|b| **b == Busy::Staging).count();
    (staging >= parallel_stages.max(1))
        .then(|| "waiting for other caches to finish staging".to_string())
}

/// What the node knows besides the caches.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// The GPUs.
    pub gpus: &'a [GpuInfo],
    /// Why no GPUs were found.
    pub gpu_detection: Option<&'a str>,
    /// Targets from the labels of inspected images, by pinned reference.
    pub images: &'a BTreeMap<String, Vec<Target>>,
    /// Complete cache directories.
    pub on_disk: &'a BTreeMap<Key, OnDisk>,
    /// Work under way.
    pub busy: &'a BTreeMap<Key, Busy>,
    /// Failures not yet due for a retry, with their message.
    pub failed: &'a BTreeMap<Key, String>,
}

/// The state of one wanted cache digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Which.
    pub key: Key,
    /// Its state.
    pub state: CacheState,
    /// GPUs it fits (once known).
    pub compatible: Vec<i32>,
    /// GPUs it does not fit, with reasons (once known).
    pub incompatible: Vec<IncompatibleGpu>,
    /// Bytes on disk, when Ready.
    pub size_bytes: Option<u64>,
    /// Detail.
    pub message: Option<String>,
    /// Machine-readable reason of the state, where there is one.
    pub reason: Option<String>,
}

/// What to do now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Read the labels of these images (compatibility is unknown).
    pub inspect: Vec<Wanted>,
    /// Pull, verify and extract these (they fit a GPU here).
    pub stage: Vec<Wanted>,
    /// Delete these directories.
    pub remove: Vec<Key>,
    /// Report these, one per wanted digest.
    pub entries: Vec<Entry>,
}

/// Decide everything for `wanted` given `inputs`.
pub fn plan(wanted: &[Wanted], inputs: Inputs<'_>) -> Plan {
    let mut plan = Plan::default();
    for w in wanted {
        let key = &w.key;
        let on_disk = inputs.on_disk.get(key);
        let mut entry = Entry {
            key: key.clone(),
            state: CacheState::Pending,
            compatible: Vec::new(),
            incompatible: Vec::new(),
            size_bytes: None,
            message: None,
            reason: None,
        };
        if let Some(problem) = &w.problem {
            entry.state = CacheState::Failed;
            entry.message = Some(problem.clone());
            plan.entries.push(entry);
            continue;
        }
        let targets = inputs
            .images
            .get(&w.pinned)
            .or(on_disk.map(|d| &d.targets).filter(|t| !t.is_empty()));
        let busy = inputs.busy.get(key);
        let Some(targets) = targets else {
            if let Some(message) = inputs.failed.get(key) {
                entry.state = CacheState::Failed;
                entry.message = Some(message.clone());
            } else if busy.is_none() {
                plan.inspect.push(w.clone());
            }
            plan.entries.push(entry);
            continue;
        };
        let (compatible, incompatible) = compat::decide(targets, inputs.gpus);
        entry.compatible = compatible;
        entry.incompatible = incompatible;
        if entry.compatible.is_empty() {
            entry.state = CacheState::Incompatible;
            entry.message = Some(if inputs.gpus.is_empty() {
                format!(
                    "no GPUs on this node ({})",
                    inputs.gpu_detection.unwrap_or("none detected")
                )
            } else {
                "no GPU on this node fits the cache".to_string()
            });
            // A real mismatch frees the space; with no GPUs detected (perhaps for a
            // moment, while the driver starts) a staged cache is kept.
            if on_disk.is_some() && !inputs.gpus.is_empty() && busy.is_none() {
                plan.remove.push(key.clone());
            }
        } else if let Some(disk) = on_disk {
            entry.state = CacheState::Ready;
            entry.size_bytes = Some(disk.size_bytes);
        } else if busy == Some(&Busy::Staging) {
            entry.state = CacheState::Staging;
        } else if let Some(message) = inputs.failed.get(key) {
            entry.state = CacheState::Failed;
            entry.message = Some(message.clone());
        } else if busy.is_none() {
            entry.state = CacheState::Staging;
            plan.stage.push(w.clone());
        }
        plan.entries.push(entry);
    }
    plan.remove.extend(unwanted(wanted, &plan.entries, inputs));
    plan
}

/// Directories on disk no wanted digest accounts for: caches deleted, digests no longer
/// pinned, nodes no longer selected. The previous digest of a cache is kept while its new
/// digest is still on its way (pods started earlier may use it).
fn unwanted(wanted: &[Wanted], entries: &[Entry], inputs: Inputs<'_>) -> Vec<Key> {
    let wanted_keys: BTreeSet<&Key> = wanted.iter().map(|w| &w.key).collect();
    let arriving: BTreeSet<(&str, &str)> = entries
        .iter()
        .filter(|e| matches!(e.state, CacheState::Pending | CacheState::Staging))
        .map(|e| (e.key.namespace.as_str(), e.key.name.as_str()))
        .collect();
    inputs
        .on_disk
        .keys()
        .filter(|k| !wanted_keys.contains(k) && !inputs.busy.contains_key(*k))
        .filter(|k| !arriving.contains(&(k.namespace.as_str(), k.name.as_str())))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use kubeairunway_kernelcache_api::{
        KernelCacheSpec, KernelCacheStatus, MountSpec, Verification, VerificationMode,
    };
    use kubeairunway_kernelcache_artifact::image::{self, CacheType};

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

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
    fn h100() -> Vec<GpuInfo> {
        vec![
            gpu(0, "NVIDIA H100 80GB HBM3", "cuda", "90", 32),
            gpu(1, "NVIDIA H100 80GB HBM3", "cuda", "90", 32),
        ]
    }
    fn a100() -> Vec<GpuInfo> {
        vec![gpu(0, "NVIDIA A100-SXM4-80GB", "cuda", "80", 32)]
    }
    fn mi210() -> Vec<GpuInfo> {
        vec![gpu(0, "AMD Instinct MI210", "hip", "gfx90a", 64)]
    }

    /// Targets of the example caches, read the way the agent reads them.
    fn example_targets(dir: &str, cache_type: CacheType) -> Vec<Target> {
        let data = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data")
            .join(dir);
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(data.join("image-config.json")).unwrap())
                .unwrap();
        let from_labels = image::from_labels(&image::labels_of_config(&config))
            .unwrap()
            .targets;
        let manifest = std::fs::read(data.join(cache_type.manifest_path())).unwrap();
        assert_eq!(
            image::manifest_targets(cache_type, &manifest).unwrap(),
            from_labels,
            "labels and manifest of {dir} agree"
        );
        from_labels
    }
    fn rocm() -> Vec<Target> {
        example_targets("triton-rocm-vector-add", CacheType::Triton)
    }
    fn sm90() -> Vec<Target> {
        vec![Target {
            backend: "cuda".into(),
            arch: "90".into(),
            warp_size: Some(32),
        }]
    }

    fn cache(name: &str, digest: &str, verified: bool) -> KernelCache {
        let mut c = KernelCache::new(
            name,
            KernelCacheSpec {
                image: format!("r.example/{name}:v1"),
                ..KernelCacheSpec::default()
            },
        );
        c.metadata.namespace = Some("ml".into());
        c.status = Some(KernelCacheStatus {
            resolved_digest: Some(digest.into()),
            pinned_image: Some(format!("r.example/{name}@{digest}")),
            verification: Some(Verification {
                mode: VerificationMode::Key,
                verified,
                ..Verification::default()
            }),
            ..KernelCacheStatus::default()
        });
        c
    }
    fn key(name: &str, digest: &str) -> Key {
        Key {
            namespace: "ml".into(),
            name: name.into(),
            digest: digest.into(),
        }
    }

    #[test]
    fn stages_wait_for_their_digest_and_for_room_to_stage() {
        let mut busy = BTreeMap::new();
        assert_eq!(stage_wait(&busy, &key("a", "sha256:1"), 2), None);
        // Reading labels takes no stage.
        busy.insert(key("b", "sha256:2"), Busy::Inspecting);
        assert_eq!(stage_wait(&busy, &key("a", "sha256:1"), 1), None);
        busy.insert(key("c", "sha256:1"), Busy::Staging);
        assert_eq!(
            stage_wait(&busy, &key("a", "sha256:1"), 2).as_deref(),
            Some("waiting for ml/c@sha256:1, the same digest, to be staged")
        );
        assert_eq!(stage_wait(&busy, &key("a", "sha256:3"), 2), None);
        assert_eq!(
            stage_wait(&busy, &key("a", "sha256:3"), 1).as_deref(),
            Some("waiting for other caches to finish staging")
        );
        // A parallelism of 0 still stages one at a time.
        assert!(stage_wait(&BTreeMap::new(), &key("a", "sha256:3"), 0).is_none());
        assert!(stage_wait(&busy, &key("a", "sha256:3"), 0).is_some());
    }

    struct World {
        gpus: Vec<GpuInfo>,
        images: BTreeMap<String, Vec<Target>>,
        on_disk: BTreeMap<Key, OnDisk>,
        busy: BTreeMap<Key, Busy>,
        failed: BTreeMap<Key, String>,
    }
    impl World {
        fn new(gpus: Vec<GpuInfo>) -> Self {
            Self {
                gpus,
                images: BTreeMap::new(),
                on_disk: BTreeMap::new(),
                busy: BTreeMap::new(),
                failed: BTreeMap::new(),
            }
        }
        fn plan(&self, caches: &[KernelCache]) -> Plan {
            let labels = BTreeMap::from([("pool".to_string(), "gpu".to_string())]);
            plan(
                &wanted(caches, Ok(&labels)),
                Inputs {
                    gpus: &self.gpus,
                    gpu_detection: (self.gpus.is_empty()).then_some("NVML: library not found"),
                    images: &self.images,
                    on_disk: &self.on_disk,
                    busy: &self.busy,
                    failed: &self.failed,
                },
            )
        }
    }

    #[test]
    fn unknown_images_are_inspected_first_and_pending() {
        let w = World::new(h100());
        let p = w.plan(&[cache("vadd", D1, true)]);
        assert_eq!(p.inspect.len(), 1);
        assert_eq!(p.inspect[0].pinned, format!("r.example/vadd@{D1}"));
        assert!(p.stage.is_empty() && p.remove.is_empty());
        assert_eq!(p.entries[0].state, CacheState::Pending);
    }

    #[test]
    fn unusable_or_unselected_caches_are_never_wanted() {
        let mut unselected = cache("other", D1, true);
        unselected.spec.node_selector = Some(BTreeMap::from([("pool".into(), "cpu".into())]));
        let mut selected = cache("mine", D1, true);
        selected.spec.node_selector = Some(BTreeMap::from([("pool".into(), "gpu".into())]));
        let mut unpinned = cache("unpinned", D1, true);
        unpinned.status.as_mut().unwrap().pinned_image = None;
        let caches = [
            cache("unverified", D1, false),
            unselected,
            selected,
            unpinned,
        ];
        let names: Vec<String> = World::new(h100())
            .plan(&caches)
            .entries
            .into_iter()
            .map(|e| e.key.name)
            .collect();
        assert_eq!(names, ["mine"]);
    }

    #[test]
    fn an_sm90_cache_is_staged_on_h100_and_incompatible_on_a100_and_mi210() {
        let c = [cache("vadd", D1, true)];
        let pinned = format!("r.example/vadd@{D1}");
        let mut w = World::new(h100());
        w.images.insert(pinned.clone(), sm90());
        let p = w.plan(&c);
        assert_eq!(p.stage.len(), 1);
        assert_eq!(p.entries[0].state, CacheState::Staging);
        assert_eq!(p.entries[0].compatible, [0, 1]);
        assert_eq!(
            p.stage[0].triton_mount,
            "/var/cache/kubeairunway/kernels/vadd"
        );

        for (gpus, reason, message) in [
            (
                a100(),
                "ArchMismatch",
                "cache built for cuda arch 90; GPU 0 (NVIDIA A100-SXM4-80GB) is 80",
            ),
            (
                mi210(),
                "BackendMismatch",
                "cache built for cuda; GPU 0 (AMD Instinct MI210) is hip",
            ),
        ] {
            let mut w = World::new(gpus);
            w.images.insert(pinned.clone(), sm90());
            let p = w.plan(&c);
            assert!(p.stage.is_empty() && p.inspect.is_empty());
            let e = &p.entries[0];
            assert_eq!(e.state, CacheState::Incompatible);
            assert_eq!(e.incompatible[0].reason, reason);
            assert_eq!(e.incompatible[0].message, message);
            assert_eq!(
                e.message.as_deref(),
                Some("no GPU on this node fits the cache")
            );
        }
    }

    #[test]
    fn the_rocm_example_fits_mi210_only() {
        let c = [cache("rocm", D1, true)];
        let pinned = format!("r.example/rocm@{D1}");
        let mut w = World::new(mi210());
        w.images.insert(pinned.clone(), rocm());
        assert_eq!(w.plan(&c).stage.len(), 1);
        let mut w = World::new(h100());
        w.images.insert(pinned, rocm());
        let p = w.plan(&c);
        assert!(p.stage.is_empty());
        assert_eq!(
            p.entries[0]
                .incompatible
                .iter()
                .map(|i| (i.index, i.reason.as_str()))
                .collect::<Vec<_>>(),
            [(0, "BackendMismatch"), (1, "BackendMismatch")]
        );
    }

    #[test]
    fn without_gpus_every_cache_is_incompatible_and_staged_ones_are_kept() {
        let c = [cache("vadd", D1, true)];
        let mut w = World::new(Vec::new());
        w.images.insert(format!("r.example/vadd@{D1}"), sm90());
        w.on_disk.insert(key("vadd", D1), OnDisk::default());
        let p = w.plan(&c);
        assert_eq!(p.entries[0].state, CacheState::Incompatible);
        assert_eq!(
            p.entries[0].message.as_deref(),
            Some("no GPUs on this node (NVML: library not found)")
        );
        assert!(p.remove.is_empty() && p.stage.is_empty());
    }

    #[test]
    fn a_complete_directory_is_ready_from_its_manifest_without_any_pull() {
        let c = [cache("vadd", D1, true)];
        let mut w = World::new(h100());
        w.on_disk.insert(
            key("vadd", D1),
            OnDisk {
                targets: sm90(),
                size_bytes: 4096,
            },
        );
        let p = w.plan(&c);
        assert!(p.inspect.is_empty() && p.stage.is_empty() && p.remove.is_empty());
        assert_eq!(p.entries[0].state, CacheState::Ready);
        assert_eq!(p.entries[0].size_bytes, Some(4096));
        // On an A100 node the same directory is incompatible and removed.
        w.gpus = a100();
        let p = w.plan(&c);
        assert_eq!(p.entries[0].state, CacheState::Incompatible);
        assert_eq!(p.remove, [key("vadd", D1)]);
    }

    #[test]
    fn deleted_caches_and_old_digests_are_removed_once_the_new_one_is_ready() {
        let mut w = World::new(h100());
        for k in [key("gone", D1), key("vadd", D1), key("vadd", D2)] {
            w.on_disk.insert(
                k,
                OnDisk {
                    targets: sm90(),
                    size_bytes: 1,
                },
            );
        }
        let p = w.plan(&[cache("vadd", D2, true)]);
        assert_eq!(p.remove, [key("gone", D1), key("vadd", D1)]);

        // While the new digest is still staging, the old one stays.
        w.on_disk.remove(&key("vadd", D2));
        w.busy.insert(key("vadd", D2), Busy::Staging);
        w.images.insert(format!("r.example/vadd@{D2}"), sm90());
        let p = w.plan(&[cache("vadd", D2, true)]);
        assert_eq!(p.remove, [key("gone", D1)]);
        assert_eq!(p.entries[0].state, CacheState::Staging);
        assert!(p.stage.is_empty(), "already under way");
    }

    #[test]
    fn failures_wait_for_their_retry_and_bad_digests_fail_clearly() {
        let mut w = World::new(h100());
        w.images.insert(format!("r.example/vadd@{D1}"), sm90());
        w.failed
            .insert(key("vadd", D1), "registry: connection refused".into());
        let p = w.plan(&[cache("vadd", D1, true)]);
        assert!(p.stage.is_empty());
        assert_eq!(p.entries[0].state, CacheState::Failed);
        assert_eq!(
            p.entries[0].message.as_deref(),
            Some("registry: connection refused")
        );

        let p = w.plan(&[cache("evil", "sha256:../../etc", true)]);
        assert_eq!(p.entries[0].state, CacheState::Failed);
        assert!(p.stage.is_empty() && p.inspect.is_empty());
        assert!(
            p.entries[0]
                .message
                .as_deref()
                .unwrap()
                .contains("not an algorithm:hex digest")
        );
    }

    #[test]
    fn keys_parse_as_they_display() {
        let k = key("vadd", D1);
        assert_eq!(Key::parse(&k.to_string()), Some(k));
        for bad in [
            "ml/vadd",
            "vadd@sha256:1",
            "/vadd@x",
            "ml/vadd@sha256:../../etc",
        ] {
            assert_eq!(Key::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_triton_mount_follows_the_spec() {
        let mut c = cache("vadd", D1, true);
        c.spec.mount = Some(MountSpec {
            path: Some("/cache/triton".into()),
            ..MountSpec::default()
        });
        assert_eq!(triton_mount(&c), "/cache/triton");
        assert_eq!(
            key("vadd", D1).dir(Path::new("/r")),
            Path::new(
                "/r/ml/vadd/sha256-1111111111111111111111111111111111111111111111111111111111111111"
            )
        );
    }
}
