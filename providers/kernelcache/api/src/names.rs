//! The names every kernel-cache component agrees on: the provider's registration and
//! field manager, where the agent stages caches on a node and where pods see them, and
//! the node label that says a cache is ready there.

/// The InferenceProviderConfig the kernel-cache provider registers (a capability
/// provider: no engines, never selected to serve).
pub const PROVIDER_NAME: &str = "kernelcache";
/// Field manager of `KernelCacheReady` on ModelDeployments (and of the provider's
/// InferenceProviderConfig).
pub const PROVIDER_FIELD_MANAGER: &str = "kernelcache-provider";

/// Where the agent stages caches unless told otherwise, `<root>/<namespace>/<name>/<digest>`
/// (the pod webhook mounts from the same root).
pub const DEFAULT_CACHE_ROOT: &str = "/var/lib/kubeairunway/kernel-caches";

/// Where Triton caches are mounted in pods unless the KernelCache says otherwise.
pub const DEFAULT_MOUNT_ROOT: &str = "/var/cache/kubeairunway/kernels";

/// Where pods see the Triton cache `name` (`TRITON_CACHE_DIR`): the KernelCache's
/// `spec.mount.path`, else `<DEFAULT_MOUNT_ROOT>/<name>`. The agent rewrites Triton group
/// files to this path, and the pod webhook mounts the cache there.
pub fn triton_dir(name: &str, path: Option<&str>) -> String {
    path.map_or_else(|| format!("{DEFAULT_MOUNT_ROOT}/{name}"), str::to_string)
}

/// The node label the agent sets (to `"true"`) when a cache is ready on a node:
/// `kernelcache.kubeairunway.ai/<namespace>.<name>`, the name part cut to the 63
/// characters a label name may have.
pub fn ready_label(namespace: &str, name: &str) -> String {
    let mut key = format!("{namespace}.{name}");
    key.truncate(63);
    format!(
        "kernelcache.kubeairunway.ai/{}",
        key.trim_end_matches(['.', '-'])
    )
}
