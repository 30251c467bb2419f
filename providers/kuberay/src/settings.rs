//! What the KubeRay provider is: its name, and the Ray LLM image it serves with
//! ([`KubeRayProvider`]).

/// The provider's name (`spec.provider.name: kuberay`).
pub const NAME: &str = "kuberay";
/// The default Ray version: the tag of `rayproject/ray-llm` (and, up to its first `-`,
/// the cluster's `rayVersion`).
pub const DEFAULT_RAY_VERSION: &str = "2.52.0-py311-cu128";
/// The default image repository of the Ray LLM image.
pub const DEFAULT_RAY_IMAGE: &str = "rayproject/ray-llm";

/// The KubeRay provider.
#[derive(Clone, Debug)]
pub struct KubeRayProvider {
    /// Image repository of the Ray LLM image, without tag.
    pub image: String,
    /// Ray version: the image tag.
    pub ray_version: String,
}

impl Default for KubeRayProvider {
    fn default() -> Self {
        Self {
            image: DEFAULT_RAY_IMAGE.to_string(),
            ray_version: DEFAULT_RAY_VERSION.to_string(),
        }
    }
}

impl KubeRayProvider {
    /// The provider with this image repository and Ray version (image tag).
    pub fn new(image: impl Into<String>, ray_version: impl Into<String>) -> Self {
        Self {
            image: image.into(),
            ray_version: ray_version.into(),
        }
    }

    /// The default serving image, `<image>:<ray version>`.
    pub fn default_image(&self) -> String {
        format!("{}:{}", self.image, self.ray_version)
    }

    /// The cluster's `rayVersion`: the Ray version up to its first `-` (`2.52.0` of
    /// `2.52.0-py311-cu128`).
    pub fn cluster_ray_version(&self) -> &str {
        self.ray_version
            .split('-')
            .next()
            .unwrap_or(&self.ray_version)
    }
}
