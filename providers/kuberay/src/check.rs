//! What KubeRay can serve (004 §8): vLLM on GPUs, aggregated or disaggregated, under a
//! name KubeRay accepts.

use kube::ResourceExt;
use kubeairunway_sdk::Incompatible;
use kubeairunway_sdk::api::{EngineType, ModelDeployment, ServingMode};

/// The longest RayService name KubeRay accepts: it derives the names of the RayCluster
/// and its Services from it and refuses longer ones.
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
    Ok(())
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
}
