"""The model the vLLM benches (vllm_load_stall.py, vllm_scheduler_outage.py) configure vLLM
with: Llama-3-8B's KV shape, as a local config.json (no weights; the model never runs)."""

import json
import pathlib

LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 32, 8, 128, 16   # Llama-3-8B's KV shape


def model_dir(root: pathlib.Path) -> str:
    """Writes the config.json into `root`; returns the directory for ModelConfig."""
    (root / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HEADS * HEAD_DIM, "intermediate_size": 14336,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "num_hidden_layers": LAYERS, "vocab_size": 128256, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}))
    return str(root)
