//! The Models page: a catalogue that works offline, with an estimate of the GPU memory a
//! model needs (weights by dtype plus the KV cache at a context length) against the GPUs
//! of the cluster (Node allocatable and NVIDIA GPU feature discovery's labels).
//!
//! The estimate, as vLLM budgets it: weights = parameters x bytes per parameter; KV cache
//! per token = 2 (K and V) x layers x KV heads x head size x bytes per KV element; the
//! engine may use `gpu-memory-utilization` (0.9, vLLM's default) of each GPU, and the
//! rest of its budget beyond weights and KV (activations, CUDA graphs) is taken as 10% of
//! the weights. It is an estimate for choosing GPUs, not a guarantee.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};

/// A model (of the built-in catalogue, or found on the hub), with the architecture
/// figures of its `config.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    /// Hugging Face id.
    pub id: Cow<'static, str>,
    /// Parameters, in millions.
    pub params_m: u64,
    /// `num_hidden_layers`.
    pub layers: u64,
    /// `num_key_value_heads`.
    pub kv_heads: u64,
    /// `head_dim` (or hidden size / attention heads).
    pub head_dim: u64,
    /// `max_position_embeddings`.
    pub max_context: u64,
    /// A GGUF build llama.cpp serves (CPU or GPU); the others are for vLLM and the like.
    pub gguf: bool,
}

/// The catalogue (figures from each model's `config.json` on the Hugging Face hub).
pub const CATALOGUE: &[Model] = &[
    Model {
        id: Cow::Borrowed("Qwen/Qwen3-0.6B"),
        params_m: 752,
        layers: 28,
        kv_heads: 8,
        head_dim: 128,
        max_context: 40_960,
        gguf: false,
    },
    Model {
        id: Cow::Borrowed("Qwen/Qwen3-8B"),
        params_m: 8_200,
        layers: 36,
        kv_heads: 8,
        head_dim: 128,
        max_context: 40_960,
        gguf: false,
    },
    Model {
        id: Cow::Borrowed("meta-llama/Llama-3.1-8B-Instruct"),
        params_m: 8_030,
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
        max_context: 131_072,
        gguf: false,
    },
    Model {
        id: Cow::Borrowed("mistralai/Mistral-7B-Instruct-v0.3"),
        params_m: 7_250,
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
        max_context: 32_768,
        gguf: false,
    },
    Model {
        id: Cow::Borrowed("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"),
        params_m: 7_620,
        layers: 28,
        kv_heads: 4,
        head_dim: 128,
        max_context: 131_072,
        gguf: false,
    },
    Model {
        id: Cow::Borrowed("meta-llama/Llama-3.1-70B-Instruct"),
        params_m: 70_600,
        layers: 80,
        kv_heads: 8,
        head_dim: 128,
        max_context: 131_072,
        gguf: false,
    },
    Model {
        id: Cow::Borrowed("Qwen/Qwen2.5-72B-Instruct"),
        params_m: 72_700,
        layers: 80,
        kv_heads: 8,
        head_dim: 128,
        max_context: 32_768,
        gguf: false,
    },
    Model {
        id: Cow::Borrowed("google/gemma-3-1b-it-qat-q8_0-gguf"),
        params_m: 1_000,
        layers: 26,
        kv_heads: 1,
        head_dim: 256,
        max_context: 32_768,
        gguf: true,
    },
];

/// `id`'s figures from its `config.json` (the text model's, `text_config`, for a
/// multimodal one) and its parameter count: `num_hidden_layers`, `num_key_value_heads`
/// (else `num_attention_heads`), `head_dim` (else `hidden_size / num_attention_heads`),
/// `max_position_embeddings`.
pub fn from_config(id: &str, parameters: u64, config: &Value) -> Result<Model, String> {
    let text = config
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(config);
    let number = |key: &str| text.get(key).and_then(Value::as_u64).filter(|n| *n > 0);
    let layers = number("num_hidden_layers").ok_or("config.json has no num_hidden_layers")?;
    let heads = number("num_attention_heads");
    let kv_heads = number("num_key_value_heads")
        .or(heads)
        .ok_or("config.json has no num_key_value_heads or num_attention_heads")?;
    let head_dim = number("head_dim")
        .or_else(|| Some(number("hidden_size")? / heads?))
        .filter(|d| *d > 0)
        .ok_or("config.json has no head_dim, nor hidden_size and num_attention_heads")?;
    Ok(Model {
        id: Cow::Owned(id.to_string()),
        params_m: parameters.div_ceil(1_000_000),
        layers,
        kv_heads,
        head_dim,
        max_context: number("max_position_embeddings").unwrap_or(u64::MAX),
        gguf: false,
    })
}

/// Bytes per weight (or KV element) of a dtype, in eighths of a byte.
pub fn eighths(dtype: &str) -> Option<u64> {
    match dtype {
        "fp32" => Some(32),
        "bf16" | "fp16" => Some(16),
        "fp8" | "int8" => Some(8),
        "int4" => Some(4),
        _ => None,
    }
}

/// What a model needs at a context length and dtype, and the GPUs of a memory size it
/// takes (a power of two, as tensor parallelism asks).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fit {
    /// Hugging Face id.
    pub id: String,
    /// Parameters, in billions, one decimal.
    pub params: String,
    /// Weights, in MB.
    pub weights_mb: u64,
    /// KV cache at the context length for one sequence, in MB.
    pub kv_mb: u64,
    /// Weights + KV + overhead, in MB.
    pub total_mb: u64,
    /// The context length used (the model's maximum when asked for more).
    pub context: u64,
    /// GPUs of the given memory it needs (`None`: more than 8).
    pub gpus: Option<u64>,
    /// A GGUF build for llama.cpp.
    pub gguf: bool,
}

/// The fit of `m` at `context` tokens, `dtype` weights (KV in 16 bits), on GPUs of
/// `gpu_mb` MB each.
pub fn fit(m: &Model, context: u64, weights_eighths: u64, gpu_mb: u64) -> Fit {
    let context = context.min(m.max_context).max(1);
    let weights = m.params_m * 1_000_000 * weights_eighths / 8;
    let kv = 2 * m.layers * m.kv_heads * m.head_dim * 2 * context;
    let total = weights + kv + weights / 10;
    let usable = gpu_mb * 1_000_000 * 9 / 10;
    let gpus = [1_u64, 2, 4, 8].into_iter().find(|n| n * usable >= total);
    Fit {
        id: m.id.to_string(),
        params: format!("{}.{}", m.params_m / 1000, (m.params_m % 1000) / 100),
        weights_mb: weights / 1_000_000,
        kv_mb: kv / 1_000_000,
        total_mb: total / 1_000_000,
        context,
        gpus,
        gguf: m.gguf,
    }
}

/// A node's GPUs: count (allocatable), product and memory per GPU (NVIDIA GPU feature
/// discovery's `nvidia.com/gpu.product` and `nvidia.com/gpu.memory`, in MiB).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeGpus {
    /// Node name.
    pub node: String,
    /// Allocatable GPUs.
    pub count: i64,
    /// GPU model.
    pub product: String,
    /// Memory per GPU in MB, when labelled.
    pub memory_mb: Option<u64>,
}

/// The GPUs of a node, `None` without any.
pub fn node_gpus(node: &Node) -> Option<NodeGpus> {
    let allocatable = node.status.as_ref()?.allocatable.as_ref()?;
    let count: i64 = allocatable.get("nvidia.com/gpu")?.0.parse().ok()?;
    if count == 0 {
        return None;
    }
    let labels = node.labels();
    Some(NodeGpus {
        node: node.name_any(),
        count,
        product: labels
            .get("nvidia.com/gpu.product")
            .cloned()
            .unwrap_or_else(|| "-".into()),
        memory_mb: labels
            .get("nvidia.com/gpu.memory")
            .and_then(|m| m.parse::<u64>().ok())
            .map(|mib| mib * 1_048_576 / 1_000_000),
    })
}

/// The cluster's GPU nodes as the user may list them, or why not.
pub async fn gpus(client: &Client) -> Value {
    let api: Api<Node> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => json!({ "nodes": list.items.iter().filter_map(node_gpus).collect::<Vec<_>>() }),
        Err(kube::Error::Api(s)) => json!({ "nodes": [], "note": s.message }),
        Err(e) => json!({ "nodes": [], "note": e.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(id: &str) -> &'static Model {
        CATALOGUE.iter().find(|m| m.id == id).unwrap()
    }

    /// The figures of a hub model from its `config.json` as the hub serves them: plain
    /// (Llama 3.1 8B's), without head_dim (Mistral's), and multimodal (Gemma 3's
    /// `text_config`); what the fit then says matches the catalogue's entry.
    #[test]
    fn hub_models_are_read_from_their_config() {
        let llama = json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
            "max_position_embeddings": 131_072});
        let m = from_config("meta-llama/Llama-3.1-8B-Instruct", 8_030_261_248, &llama).unwrap();
        let catalogue = model("meta-llama/Llama-3.1-8B-Instruct");
        assert_eq!(
            (m.layers, m.kv_heads, m.head_dim, m.max_context),
            (
                catalogue.layers,
                catalogue.kv_heads,
                catalogue.head_dim,
                catalogue.max_context
            )
        );
        let (hub, ours) = (fit(&m, 8192, 16, 24_000), fit(catalogue, 8192, 16, 24_000));
        // 8,031 M parameters (rounded up) against the catalogue's 8,030: 2 MB more weights.
        assert_eq!(hub.total_mb - ours.total_mb, 2, "{hub:?} {ours:?}");
        assert_eq!(hub.gpus, ours.gpus);
        let gemma = json!({"architectures": ["Gemma3ForConditionalGeneration"],
            "text_config": {"num_hidden_layers": 34, "num_key_value_heads": 4, "head_dim": 256,
                            "num_attention_heads": 8, "hidden_size": 2560}});
        let g = from_config("google/gemma-3-4b-it", 4_300_000_000, &gemma).unwrap();
        assert_eq!((g.layers, g.kv_heads, g.head_dim), (34, 4, 256));
        assert_eq!(
            g.max_context,
            u64::MAX,
            "none given: the context asked is used"
        );
        let no_layers = from_config("x/y", 1, &json!({"hidden_size": 10})).unwrap_err();
        assert!(no_layers.contains("num_hidden_layers"), "{no_layers}");
    }

    #[test]
    fn weights_and_kv_as_vllm_budgets_them() {
        // Llama 3.1 8B in bf16: 16.06 GB of weights; KV 2 x 32 x 8 x 128 x 2 bytes =
        // 131,072 bytes per token, 1.07 GB at 8,192 tokens.
        let f = fit(model("meta-llama/Llama-3.1-8B-Instruct"), 8192, 16, 24_000);
        assert_eq!((f.weights_mb, f.kv_mb, f.total_mb), (16_060, 1_073, 18_739));
        assert_eq!(f.gpus, Some(1), "fits one 24 GB GPU at 0.9 of its memory");
        // At its full context the KV cache alone is 17 GB: two GPUs.
        let f = fit(
            model("meta-llama/Llama-3.1-8B-Instruct"),
            1 << 20,
            16,
            24_000,
        );
        assert_eq!((f.context, f.kv_mb, f.gpus), (131_072, 17_179, Some(2)));
        // 70B in bf16 (158 GB) needs 4 H100s (80 GB), in fp8 2, 8 GPUs of 24 GB, and more
        // than 8 of 16 GB.
        let seventy = model("meta-llama/Llama-3.1-70B-Instruct");
        assert_eq!(fit(seventy, 8192, 16, 80_000).gpus, Some(4));
        assert_eq!(fit(seventy, 8192, 8, 80_000).gpus, Some(2));
        assert_eq!(fit(seventy, 8192, 16, 24_000).gpus, Some(8));
        assert_eq!(fit(seventy, 8192, 16, 16_000).gpus, None);
        assert_eq!(fit(seventy, 8192, 16, 80_000).params, "70.6");
    }

    #[test]
    fn gpus_come_from_allocatable_and_feature_discovery_labels() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "gpu-1", "labels": {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "96"}}}))
        .unwrap();
        assert_eq!(
            node_gpus(&node),
            Some(NodeGpus {
                node: "gpu-1".into(),
                count: 8,
                product: "NVIDIA-H100-80GB-HBM3".into(),
                memory_mb: Some(85_520)
            })
        );
        let cpu: Node = serde_json::from_value(json!({"metadata": {"name": "cpu-1"},
            "status": {"allocatable": {"cpu": "8"}}}))
        .unwrap();
        assert_eq!(node_gpus(&cpu), None);
        assert_eq!(eighths("int4"), Some(4));
        assert_eq!(eighths("fp64"), None);
    }
}
