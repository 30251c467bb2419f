//! What KubeRay refuses beyond its registered capabilities (vLLM on GPUs, aggregated or
//! disaggregated: the runtime checks those before [`check`] runs): a name KubeRay does
//! not accept, and anything in the spec that KubeRay's validation or Ray Serve LLM would
//! refuse later (where KubeRay 1.3 would only log it and never start).

use std::collections::BTreeMap;

use kube::ResourceExt;
use kubeairunway_sdk::Incompatible;
use kubeairunway_sdk::api::ModelDeployment;

use crate::serve_config::{PIPELINE_PARALLEL_KWARG, TENSOR_PARALLEL_KWARG, kwarg_key, roles};

/// The longest RayService name KubeRay accepts: 53 (the longest RayCluster name, so that
/// `<cluster>-serve-svc` fits in 63 characters) minus the 6 characters of the cluster
/// suffix (ray-project/kuberay `ray-operator/controllers/ray/utils/constant.go:372-378@v1.7.0`,
/// checked by `ValidateRayServiceMetadata`, `utils/validation.go:632-646@v1.7.0`, in the
/// controller and the optional webhook).
pub const MAX_NAME_LENGTH: usize = 47;

/// Environment variables KubeRay refuses in the head container (and we render `spec.env`
/// there): `RAY_REDIS_ADDRESS` without GCS fault tolerance, `REDIS_USERNAME` always
/// (ray-project/kuberay `ray-operator/controllers/ray/utils/validation.go:39-45,69-72@v1.3.0`,
/// `:158-164,192-195@v1.7.0`). 1.7 fails the RayService; 1.3 only refuses its RayCluster
/// in an event, so the deployment would never start.
pub const REFUSED_ENV: [&str; 2] = ["RAY_REDIS_ADDRESS", "REDIS_USERNAME"];

/// `engine.args` keys Ray Serve LLM refuses in `engine_kwargs`: it sets the model and the
/// served name from `model_loading_config` (`python/ray/llm/_internal/serve/engines/vllm/vllm_models.py:120-123@ray-2.52.0`).
pub const REFUSED_ENGINE_ARGS: [&str; 2] = ["model", "served_model_name"];

/// Refuse what KubeRay cannot serve among the specs its capabilities cover, with the
/// user-facing message.
pub fn check(md: &ModelDeployment) -> Result<(), Incompatible> {
    name(md)?;
    environment(md)?;
    engine_args(md)?;
    crate::storage::check(md).map_err(Incompatible)
}

fn name(md: &ModelDeployment) -> Result<(), Incompatible> {
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

fn environment(md: &ModelDeployment) -> Result<(), Incompatible> {
    let refused = md
        .spec
        .env
        .iter()
        .flatten()
        .find(|e| REFUSED_ENV.contains(&e.name.as_str()));
    match refused {
        Some(e) => Err(Incompatible(format!(
            "KubeRay refuses the environment variable {} in the Ray head (it belongs to GCS \
             fault tolerance, which this provider does not configure): remove it from spec.env",
            e.name
        ))),
        None => Ok(()),
    }
}

/// What Ray Serve LLM refuses in `engine_kwargs`, and a parallelism that does not match
/// the GPUs of a replica's worker pod.
fn engine_args(md: &ModelDeployment) -> Result<(), Incompatible> {
    let args: BTreeMap<String, &str> = md
        .spec
        .engine
        .args
        .iter()
        .flatten()
        .map(|(k, v)| (kwarg_key(k), v.as_str()))
        .collect();
    if let Some(key) = REFUSED_ENGINE_ARGS.iter().find(|k| args.contains_key(**k)) {
        return Err(Incompatible(format!(
            "engine.args {key} cannot be set with KubeRay: Ray Serve LLM sets the model from \
             spec.model.id and the served name from spec.model.servedName"
        )));
    }
    // `distributed_executor_backend` must be `ray` (vllm_models.py:128-134@ray-2.52.0).
    if let Some(backend) = args.get("distributed_executor_backend")
        && *backend != "ray"
    {
        return Err(Incompatible(format!(
            "engine.args distributed-executor-backend {backend:?} cannot be used with KubeRay: \
             Ray Serve LLM runs vLLM's workers with the ray backend"
        )));
    }
    // Each replica's vLLM workers take `tensor_parallel_size * pipeline_parallel_size`
    // GPUs in one placement group (vllm_models.py:213-254@ray-2.52.0), and each replica
    // runs on one worker pod with the GPUs of its role.
    let size = |key: &str| args.get(key).and_then(|v| v.parse::<i32>().ok());
    let (tp, pp) = (size(TENSOR_PARALLEL_KWARG), size(PIPELINE_PARALLEL_KWARG));
    if tp.is_none() && pp.is_none() {
        return Ok(());
    }
    for (role, r) in roles(md) {
        let devices = tp.unwrap_or(r.gpus) * pp.unwrap_or(1);
        if devices != r.gpus {
            let who = match role {
                "aggregated" => "each replica".to_string(),
                _ => format!("each {role} replica"),
            };
            return Err(Incompatible(format!(
                "engine.args tensor-parallel-size x pipeline-parallel-size is {devices} but \
                 {who} has {} GPUs: KubeRay runs each replica on one worker pod with its \
                 GPUs, so they must be equal (tensor parallelism defaults to the GPU count)",
                r.gpus
            )));
        }
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
    use kubeairunway_sdk::testing::ModelDeploymentBuilder;

    fn refused(md: &ModelDeployment) -> String {
        check(md).unwrap_err().0
    }

    #[test]
    fn vllm_on_gpu_is_served() {
        assert_eq!(check(&ModelDeploymentBuilder::new("m").build()), Ok(()));
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

    /// `ValidateRayClusterSpec` (ray-operator/controllers/ray/utils/validation.go:39-45,69-72@v1.3.0,
    /// :158-164,192-195@v1.7.0) on the head container, which gets `spec.env`.
    #[test]
    fn environment_kuberay_refuses_is_refused_validation_go_39_v1_3_0() {
        for name in REFUSED_ENV {
            let md = ModelDeploymentBuilder::new("m")
                .spec(|s| {
                    s.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
                        name: name.into(),
                        value: Some("x".into()),
                        value_from: None,
                    }]);
                })
                .build();
            assert!(refused(&md).contains(name), "{name}");
        }
    }

    fn with_args(gpus: i32, args: &[(&str, &str)]) -> ModelDeployment {
        let args: BTreeMap<String, String> = args
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        ModelDeploymentBuilder::new("m")
            .gpus(gpus)
            .spec(move |s| s.engine.args = Some(args))
            .build()
    }

    /// python/ray/llm/_internal/serve/engines/vllm/vllm_models.py:120-134@ray-2.52.0
    #[test]
    fn engine_arguments_ray_serve_llm_refuses_are_refused_vllm_models_py_120_ray_2_52_0() {
        for key in ["--model", "served-model-name"] {
            assert!(refused(&with_args(1, &[(key, "x")])).contains("cannot be set with KubeRay"));
        }
        assert!(
            refused(&with_args(1, &[("distributed-executor-backend", "mp")]))
                .contains("distributed-executor-backend")
        );
        assert_eq!(
            check(&with_args(1, &[("distributed-executor-backend", "ray")])),
            Ok(())
        );
    }

    /// A replica's placement group is tensor x pipeline parallel GPU bundles
    /// (vllm_models.py:213-254@ray-2.52.0) on its one worker pod.
    #[test]
    fn parallelism_must_match_the_gpus_of_a_replica_vllm_models_py_213_ray_2_52_0() {
        assert_eq!(
            check(&with_args(4, &[("tensor-parallel-size", "4")])),
            Ok(())
        );
        assert_eq!(
            check(&with_args(
                4,
                &[
                    ("tensor-parallel-size", "2"),
                    ("pipeline-parallel-size", "2")
                ]
            )),
            Ok(())
        );
        let message = refused(&with_args(4, &[("tensor-parallel-size", "8")]));
        assert!(
            message.contains("is 8 but each replica has 4 GPUs"),
            "{message}"
        );
        let message = refused(&with_args(2, &[("pipeline-parallel-size", "2")]));
        assert!(message.contains("is 4"), "{message}");
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
