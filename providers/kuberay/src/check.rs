//! What KubeRay can serve (004 §8): vLLM on GPUs, aggregated or disaggregated, under a
//! name KubeRay accepts.

use kube::ResourceExt;
use kubeairunway_sdk::Incompatible;
use kubeairunway_sdk::api::{EngineType, ModelDeployment, ServingMode};

/// The longest RayService name KubeRay accepts: 53 (the longest RayCluster name, so that
/// `<cluster>-serve-svc` fits in 63 characters) minus the 6 characters of the cluster
/// suffix (ray-project/kuberay `ray-operator/controllers/ray/utils/constant.go:372-378@v1.7.0`,
/// checked by `ValidateRayServiceMetadata`, `utils/validation.go:632-646@v1.7.0`, in the
/// controller and the optional webhook).
pub const MAX_NAME_LENGTH: usize = 47;

/// 004 §8's message for a deployment without GPUs.
pub const REQUIRES_GPU: &str = "KubeRay requires GPU (set resources.gpu.count > 0)";

/// Refuse what KubeRay cannot serve, with the user-facing message.
pub fn check(md: &ModelDeployment) -> Result<(), Incompatible> {
    let spec = &md.spec;
    match spec.engine.type_ {
        Some(EngineType::Vllm) => {}
        Some(other) => {
            return Err(Incompatible(format!(
                "KubeRay does not support {} engine",
                other.as_str()
            )));
        }
        None => {
            return Err(Incompatible(
                "KubeRay supports only the vllm engine; spec.engine.type is not set".into(),
            ));
        }
    }
    let gpus_ok = match spec.serving.mode {
        ServingMode::Aggregated => spec.gpu_count() > 0,
        ServingMode::Disaggregated => [&spec.scaling.prefill, &spec.scaling.decode]
            .into_iter()
            .all(|c| {
                c.as_ref()
                    .and_then(|c| c.gpu.as_ref())
                    .is_some_and(|g| g.count > 0)
            }),
    };
    if !gpus_ok {
        return Err(Incompatible(REQUIRES_GPU.into()));
    }
    let name = md.name_any();
    if name.len() > MAX_NAME_LENGTH {
        return Err(Incompatible(format!(
            "KubeRay accepts RayService names of at most {MAX_NAME_LENGTH} characters; \
             the ModelDeployment name {name:?} has {}: choose a shorter name",
            name.len()
        )));
    }
    // A ModelDeployment name may be any DNS-1123 subdomain; KubeRay wants a DNS-1035
    // label (`utils/validation.go:636-638@v1.7.0`), and even without that check (1.3) the
    // Services it names after the RayService must be one.
    if !is_dns1035_label(&name) {
        return Err(Incompatible(format!(
            "KubeRay needs a name that is a DNS-1035 label (lowercase letters, digits and '-', \
             starting with a letter and ending with a letter or digit) for the RayService and \
             the Services it names after it; {name:?} is not: choose another name"
        )));
    }
    Ok(())
}

/// Kubernetes' `IsDNS1035Label`: `[a-z]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns1035_label(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() <= 63
        && b.first().is_some_and(u8::is_ascii_lowercase)
        && b.last()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_sdk::api::{ComponentScaling, GpuSpec};
    use kubeairunway_sdk::testing::ModelDeploymentBuilder;

    fn refused(md: &ModelDeployment) -> String {
        check(md).unwrap_err().0
    }

    #[test]
    fn vllm_on_gpu_is_served() {
        assert_eq!(check(&ModelDeploymentBuilder::new("m").build()), Ok(()));
    }

    #[test]
    fn other_engines_are_refused_with_the_messages_of_004() {
        for (engine, message) in [
            (
                EngineType::Llamacpp,
                "KubeRay does not support llamacpp engine",
            ),
            (EngineType::Sglang, "KubeRay does not support sglang engine"),
            (EngineType::Trtllm, "KubeRay does not support trtllm engine"),
        ] {
            assert_eq!(
                refused(&ModelDeploymentBuilder::new("m").engine(engine).build()),
                message
            );
        }
        let unset = ModelDeploymentBuilder::new("m")
            .spec(|s| s.engine.type_ = None)
            .build();
        assert!(refused(&unset).contains("only the vllm engine"));
    }

    #[test]
    fn cpu_only_is_refused() {
        assert_eq!(
            refused(&ModelDeploymentBuilder::new("m").gpus(0).build()),
            REQUIRES_GPU
        );
        let no_resources = ModelDeploymentBuilder::new("m")
            .spec(|s| s.resources = None)
            .build();
        assert_eq!(refused(&no_resources), REQUIRES_GPU);
    }

    #[test]
    fn disaggregated_needs_gpus_on_both_roles() {
        let role = |count| ComponentScaling {
            replicas: 1,
            gpu: Some(GpuSpec {
                count,
                ..GpuSpec::default()
            }),
            memory: None,
        };
        let md = |p, d| {
            ModelDeploymentBuilder::new("m")
                .mode(ServingMode::Disaggregated)
                .spec(move |s| {
                    s.resources = None;
                    s.scaling.prefill = Some(role(p));
                    s.scaling.decode = Some(role(d));
                })
                .build()
        };
        assert_eq!(check(&md(1, 2)), Ok(()));
        assert_eq!(refused(&md(1, 0)), REQUIRES_GPU);
        assert_eq!(refused(&md(0, 1)), REQUIRES_GPU);
    }

    #[test]
    fn names_longer_than_kuberay_accepts_are_refused() {
        let ok = "a".repeat(MAX_NAME_LENGTH);
        assert_eq!(check(&ModelDeploymentBuilder::new(&ok).build()), Ok(()));
        let long = "a".repeat(MAX_NAME_LENGTH + 1);
        let message = refused(&ModelDeploymentBuilder::new(&long).build());
        assert!(
            message.starts_with("KubeRay accepts RayService names of at most 47 characters"),
            "{message}"
        );
        assert!(message.contains("has 48"), "{message}");
    }

    /// `ValidateRayServiceMetadata` (ray-operator/controllers/ray/utils/validation.go:636-638@v1.7.0).
    #[test]
    fn names_that_are_not_dns_1035_labels_are_refused_validation_go_636_v1_7_0() {
        for ok in ["llama", "l", "llama-3-8b"] {
            assert_eq!(
                check(&ModelDeploymentBuilder::new(ok).build()),
                Ok(()),
                "{ok}"
            );
        }
        for bad in ["llama.v2", "3llama", "llama-"] {
            let message = refused(&ModelDeploymentBuilder::new(bad).build());
            assert!(message.contains("DNS-1035 label"), "{bad}: {message}");
        }
    }
}
