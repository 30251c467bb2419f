//! The names every kernel-cache component agrees on: the provider's registration and
//! field manager, where the agent stages caches on a node and where pods see them, and
//! the node labels that say a kernel or model cache is ready there.

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

/// The node label set (to `"true"`) on a node where a cache is ready:
/// `kernelcache.kubeairunway.ai/<namespace>.<name>`. A label name has at most 63
/// characters: a longer `<namespace>.<name>` keeps its first 54 and ends with `-` and 8
/// hex digits of the SHA-256 of the whole, so two caches whose names share a long prefix
/// never share a label (and no pod lands on a node that only has the other's cache).
pub fn ready_label(namespace: &str, name: &str) -> String {
    prefixed_label(KERNEL_LABEL_PREFIX, namespace, name)
}

/// The annotation the pod webhook puts on a serving pod it gave a kernel cache:
/// `<namespace>/<name>@<digest>`. The controller records, per node, the caches of the
/// pods there that carry it (`KernelCacheNode.spec.inUse`).
pub const INJECTED_ANNOTATION: &str = "cache.kubeairunway.ai/injected";

/// The prefix of the kernel caches' ready labels on Nodes.
pub const KERNEL_LABEL_PREFIX: &str = "kernelcache.kubeairunway.ai/";
/// The prefix of the model caches' ready labels on Nodes.
pub const MODEL_LABEL_PREFIX: &str = "modelcache.kubeairunway.ai/";

/// The node label set (to `"true"`) on a node where a ModelCache is ready:
/// `modelcache.kubeairunway.ai/<namespace>.<name>`, shortened as [`ready_label`] does.
pub fn model_ready_label(namespace: &str, name: &str) -> String {
    prefixed_label(MODEL_LABEL_PREFIX, namespace, name)
}

/// The Secret in the credentials namespace where the controller hands over the hub token
/// of the ModelCache `namespace/name` (key [`MODEL_TOKEN_KEY`]), or the registry
/// credentials of an `oci://` one (a docker config, key [`DOCKER_CONFIG_KEY`], holding
/// its registry's entry only): `modelcache-token-` and
/// 40 hex digits of the SHA-256 of `namespace/name`. The node agents read Secrets in
/// that namespace only, never a user's.
pub fn model_token_secret(namespace: &str, name: &str) -> String {
    format!("modelcache-token-{}", hash40(namespace, name))
}

/// 40 hex digits of the SHA-256 of `namespace/name`.
fn hash40(namespace: &str, name: &str) -> String {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hex = hash.iter().fold(String::new(), |mut s, b| {
        use std::fmt::Write as _;
        let _ = write!(s, "{b:02x}");
        s
    });
    hex[..40].to_string()
}

/// The StorageClass of the model caches' local PersistentVolumes and their claims (no
/// provisioner: the controller creates each PV, pre-bound to its claim).
pub const MODEL_STORAGE_CLASS: &str = "kubeairunway-modelcache";

/// The cluster-scoped PersistentVolume of the ModelCache `namespace/name`:
/// `modelcache-` and 40 hex digits of the SHA-256 of `namespace/name`.
pub fn model_volume(namespace: &str, name: &str) -> String {
    format!("modelcache-{}", hash40(namespace, name))
}

/// The PersistentVolumeClaim (in the ModelCache's namespace) serving pods mount:
/// `modelcache-<name>`, or `modelcache-<40 hex>` when that would be longer than a name
/// may be (253).
pub fn model_claim(namespace: &str, name: &str) -> String {
    let claim = format!("modelcache-{name}");
    if claim.len() <= 253 {
        claim
    } else {
        model_volume(namespace, name)
    }
}

/// The repository's folder in an `HF_HUB_CACHE` (`models--{org}--{name}`), as the agent
/// and huggingface_hub lay it out; `repo` is `org/name` as [`crate::model::parse_source`]
/// accepts it.
pub fn hub_folder(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// Where serving pods see a model cache: their `HF_HUB_CACHE` (unless a container sets
/// its own), the ModelCache's repository folder mounted below it.
pub const MODEL_MOUNT_ROOT: &str = "/models/hf";

/// The key of the handed-over token in [`model_token_secret`].
pub const MODEL_TOKEN_KEY: &str = "token";
/// The key of a handed-over docker config (`kubernetes.io/dockerconfigjson`).
pub const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";

/// `<prefix><namespace>.<name>`, the name part at most 63 characters (see [`ready_label`]).
fn prefixed_label(prefix: &str, namespace: &str, name: &str) -> String {
    const MAX: usize = 63;
    let key = format!("{namespace}.{name}");
    let key = if key.len() <= MAX {
        key
    } else {
        use sha2::Digest as _;
        let hash = sha2::Sha256::digest(key.as_bytes());
        let suffix: String = hash[..4].iter().fold(String::new(), |mut s, b| {
            use std::fmt::Write as _;
            let _ = write!(s, "{b:02x}");
            s
        });
        // Namespaces and names are DNS labels or subdomains: ASCII, so any byte is a
        // character boundary.
        let kept = key[..MAX - 1 - suffix.len()].trim_end_matches(['.', '-']);
        format!("{kept}-{suffix}")
    };
    format!("{prefix}{key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid label name part: at most 63 characters, alphanumerics, `-`, `_` and `.`,
    /// starting and ending alphanumeric.
    fn valid_name(label: &str) -> bool {
        let (prefix, name) = label.split_once('/').unwrap();
        prefix == "kernelcache.kubeairunway.ai"
            && !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric())
    }

    #[test]
    fn ready_labels_are_valid_and_distinct_for_names_sharing_a_long_prefix() {
        assert_eq!(
            ready_label("ml", "vadd"),
            "kernelcache.kubeairunway.ai/ml.vadd",
            "short names keep the label they always had"
        );
        let long = "llama-3-1-70b-instruct-triton-kernels-for-h100-sxm";
        let a = ready_label("inference-team", &format!("{long}-v1"));
        let b = ready_label("inference-team", &format!("{long}-v2"));
        assert_ne!(a, b);
        for label in [&a, &b, &ready_label(&"n".repeat(63), &"c".repeat(253))] {
            assert!(valid_name(label), "{label}");
        }
        // Cut where a '.' or '-' would end the kept part: it never ends the name.
        let dotted = ready_label(&"a".repeat(53), "b-long-name-beyond-the-limit");
        assert!(valid_name(&dotted), "{dotted}");
        assert_eq!(
            a,
            ready_label("inference-team", &format!("{long}-v1")),
            "stable"
        );
    }

    #[test]
    fn model_token_secrets_are_dns_names_distinct_per_cache() {
        let a = model_token_secret("ml", "qwen");
        assert!(a.starts_with("modelcache-token-") && a.len() == 57, "{a}");
        assert_ne!(a, model_token_secret("ml", "qwen2"));
        assert_ne!(a, model_token_secret("m", "lqwen"));
    }

    #[test]
    fn model_labels_have_their_own_prefix_and_the_same_shortening() {
        assert_eq!(
            model_ready_label("ml", "qwen"),
            "modelcache.kubeairunway.ai/ml.qwen"
        );
        let long = model_ready_label(&"n".repeat(63), &"c".repeat(253));
        let (prefix, name) = long.split_once('/').unwrap();
        assert_eq!(prefix, "modelcache.kubeairunway.ai");
        assert_eq!(
            name,
            ready_label(&"n".repeat(63), &"c".repeat(253))
                .split_once('/')
                .unwrap()
                .1
        );
    }
}
