//! The sample ModelDeployments under `config/samples/`: four examples (aggregated vLLM,
//! llama.cpp on CPU, an engine core chooses, disaggregated vLLM with KV-aware routing), and under `config/samples/invalid/` one object
//! per rule of the ModelDeployment CRD that the API server itself enforces, each with the
//! field and message it is refused with.

use serde_json::{Value, json};

/// Why the API server refuses a sample.
#[derive(Debug, Clone)]
pub struct Rejection {
    /// The field path the API server names.
    pub field: &'static str,
    /// The message, exactly as the CRD's rule words it.
    pub message: &'static str,
}

/// One sample manifest.
#[derive(Debug, Clone)]
pub struct Sample {
    /// File stem.
    pub name: &'static str,
    /// What the sample shows (the file's header comment).
    pub description: &'static str,
    /// The manifest as a user writes it.
    pub manifest: Value,
    /// `Some` for a sample the API server must refuse.
    pub rejection: Option<Rejection>,
}

impl Sample {
    /// Path of the generated file, relative to the repository root.
    pub fn path(&self) -> String {
        match self.rejection {
            None => format!("config/samples/{}.yaml", self.name),
            Some(_) => format!("config/samples/invalid/{}.yaml", self.name),
        }
    }
}

fn md(name: &str, spec: Value) -> Value {
    let mut manifest = json!({
        "apiVersion": "kubeairunway.ai/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": "default"},
    });
    manifest["spec"] = spec;
    manifest
}

fn rejected(
    name: &'static str,
    description: &'static str,
    field: &'static str,
    message: &'static str,
    spec: Value,
) -> Sample {
    Sample {
        name,
        description,
        manifest: md(name, spec),
        rejection: Some(Rejection { field, message }),
    }
}

/// Every sample, valid ones first.
pub fn all() -> Vec<Sample> {
    vec![
        Sample {
            name: "gpu-vllm",
            description: "A GPU vLLM deployment with no provider named: core selects one (dynamo with the built-in providers).",
            manifest: md(
                "llama-8b",
                json!({
                    "model": {"id": "meta-llama/Llama-3.1-8B-Instruct", "source": "huggingface"},
                    "engine": {"type": "vllm", "contextLength": 8192},
                    "serving": {"mode": "aggregated"},
                    "scaling": {"replicas": 1},
                    "resources": {"gpu": {"count": 1}, "memory": "32Gi"},
                    "secrets": {"huggingFaceToken": "hf-token"},
                }),
            ),
            rejection: None,
        },
        Sample {
            name: "cpu-llamacpp",
            description: "A CPU-only llama.cpp deployment of a GGUF model: core selects kaito, the only CPU provider.\nThe image must serve on port 5000.",
            manifest: md(
                "gemma-cpu",
                json!({
                    "model": {"id": "google/gemma-3-1b-it-qat-q8_0-gguf", "source": "huggingface"},
                    "engine": {"type": "llamacpp"},
                    "serving": {"mode": "aggregated"},
                    "scaling": {"replicas": 1},
                    "resources": {"gpu": {"count": 0}, "memory": "16Gi", "cpu": "8"},
                    "image": "ghcr.io/sozercan/llama-cpp-runner:latest",
                }),
            ),
            rejection: None,
        },
        Sample {
            name: "auto-engine",
            description: "AI Runway's README example: no engine, no provider. Core chooses the engine from the ready providers'\ncapabilities and records it in status.engine: vLLM with its default GPU (dynamo with the built-in providers).",
            manifest: md(
                "qwen3",
                json!({
                    "model": {"id": "Qwen/Qwen3-0.6B"},
                }),
            ),
            rejection: None,
        },
        Sample {
            name: "disaggregated-kv-routing",
            description: "Disaggregated prefill/decode serving on Dynamo with KV-cache-aware routing.\nrouterMode reaches Dynamo's frontend as DYN_ROUTER_MODE (Dynamo has no router-mode field).",
            manifest: md(
                "llama-70b-pd",
                json!({
                    "model": {"id": "meta-llama/Llama-3.1-70B-Instruct", "source": "huggingface"},
                    "provider": {
                        "name": "dynamo",
                        "overrides": {
                            "routerMode": "kv",
                            "frontend": {"replicas": 2, "resources": {"cpu": "4", "memory": "8Gi"}},
                        },
                    },
                    "engine": {"type": "vllm"},
                    "serving": {"mode": "disaggregated"},
                    "scaling": {
                        "prefill": {"replicas": 2, "gpu": {"count": 4}, "memory": "128Gi"},
                        "decode": {"replicas": 4, "gpu": {"count": 2}, "memory": "64Gi"},
                    },
                    "secrets": {"huggingFaceToken": "hf-token"},
                }),
            ),
            rejection: None,
        },
        rejected(
            "vllm-without-gpu",
            "vLLM needs a GPU; an explicit count of 0 is CPU-only (with no GPU request at all, core's webhook asks for one).",
            "spec.resources.gpu.count",
            "vLLM engine requires GPU (set resources.gpu.count > 0)",
            json!({"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 0}}}),
        ),
        rejected(
            "sglang-zero-gpus",
            "SGLang needs a GPU.",
            "spec.resources.gpu.count",
            "SGLang engine requires GPU (set resources.gpu.count > 0)",
            json!({"model": {"id": "Qwen/Qwen2.5-7B-Instruct"}, "engine": {"type": "sglang"}, "resources": {"gpu": {"count": 0}}}),
        ),
        rejected(
            "trtllm-without-gpu",
            "TensorRT-LLM needs a GPU.",
            "spec.resources.gpu.count",
            "TensorRT-LLM engine requires GPU (set resources.gpu.count > 0)",
            json!({"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "engine": {"type": "trtllm"}, "resources": {"gpu": {"count": 0}, "memory": "32Gi"}}),
        ),
        rejected(
            "disaggregated-with-resources-gpu",
            "Disaggregated serving takes GPUs per role from scaling.prefill/decode, never from resources.gpu.",
            "spec.resources.gpu",
            "Cannot specify both resources.gpu and scaling.prefill/decode",
            json!({
                "model": {"id": "meta-llama/Llama-3.1-70B-Instruct"},
                "engine": {"type": "vllm"},
                "serving": {"mode": "disaggregated"},
                "resources": {"gpu": {"count": 1}},
                "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 1}}},
            }),
        ),
        rejected(
            "disaggregated-without-roles",
            "Disaggregated serving needs both a prefill and a decode role.",
            "spec.scaling",
            "Disaggregated mode requires scaling.prefill and scaling.decode",
            json!({
                "model": {"id": "meta-llama/Llama-3.1-70B-Instruct"},
                "engine": {"type": "vllm"},
                "serving": {"mode": "disaggregated"},
                "scaling": {"prefill": {"gpu": {"count": 1}}},
            }),
        ),
        rejected(
            "disaggregated-prefill-without-gpu",
            "Each disaggregated role needs a GPU count.",
            "spec.scaling.prefill.gpu.count",
            "Disaggregated mode requires scaling.prefill.gpu.count",
            json!({
                "model": {"id": "meta-llama/Llama-3.1-70B-Instruct"},
                "engine": {"type": "vllm"},
                "serving": {"mode": "disaggregated"},
                "scaling": {"prefill": {"memory": "64Gi"}, "decode": {"gpu": {"count": 1}}},
            }),
        ),
        rejected(
            "disaggregated-decode-without-gpu",
            "Each disaggregated role needs a GPU count.",
            "spec.scaling.decode.gpu.count",
            "Disaggregated mode requires scaling.decode.gpu.count",
            json!({
                "model": {"id": "meta-llama/Llama-3.1-70B-Instruct"},
                "engine": {"type": "vllm"},
                "serving": {"mode": "disaggregated"},
                "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 0}}},
            }),
        ),
        rejected(
            "warmup-named-and-inline",
            "spec.warmup names an existing Warmup or is an inline one, not both.",
            "spec.warmup.name",
            "spec.warmup is either a reference to a Warmup (name) or an inline warmup (imagesPreload, kernelCaches, modelCaches, customAction, tolerations, policies), not both",
            json!({
                "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"type": "vllm"},
                "resources": {"gpu": {"count": 1}},
                "warmup": {"name": "preload", "policies": {"parallelism": 1}},
            }),
        ),
        rejected(
            "warmup-max-failed-nodes-without-backoff",
            "An inline warmup that tolerates failed nodes must say when a node has failed: after backoffLimitPerNode retries.",
            "spec.warmup.policies.backoffLimitPerNode",
            "backoffLimitPerNode must be set when maxFailedNodes is specified (without it a node is retried forever and never counts as failed)",
            json!({
                "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"type": "vllm"},
                "resources": {"gpu": {"count": 1}},
                "warmup": {"policies": {"maxFailedNodes": 1}},
            }),
        ),
        rejected(
            "warmup-inline-ttl",
            "The Warmup of an inline warmup lives as long as its ModelDeployment: no time to live.",
            "spec.warmup.policies.ttlSecondsAfterFinished",
            "ttlSecondsAfterFinished is not allowed in spec.warmup: the Warmup made from it lives as long as the ModelDeployment, which deletes it; one deleted after a time to live, maybe before the provider saw it complete, would be made and run again",
            json!({
                "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"type": "vllm"},
                "resources": {"gpu": {"count": 1}},
                "warmup": {"policies": {"ttlSecondsAfterFinished": 600}},
            }),
        ),
        rejected(
            "image-and-engine-image-differ",
            "spec.image and spec.engine.image are one setting (AI Runway's engine.image is the preferred name): set one, or both to the same image.",
            "spec.engine.image",
            "spec.image and spec.engine.image name different images: they are the same setting, so set one of them (spec.engine.image is preferred) or both to the same image",
            json!({
                "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"type": "vllm", "image": "vllm/vllm-openai:v0.11.0"},
                "image": "vllm/vllm-openai:v0.10.2",
                "resources": {"gpu": {"count": 1}},
            }),
        ),
        rejected(
            "huggingface-without-model-id",
            "A Hugging Face model needs its id.",
            "spec.model.id",
            "model.id is required when source is huggingface",
            json!({"model": {"source": "huggingface"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}}),
        ),
    ]
}
