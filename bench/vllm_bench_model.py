"""The model and vLLM config the vLLM benches (vllm_load_stall.py, vllm_scheduler_outage.py)
run kvpool.vllm with: Llama-3-8B's KV shape, as a local config.json (no weights; the model never
runs), on the CPU, with the connector in namespace "bench"."""

import json
import pathlib

from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         SchedulerConfig, VllmConfig)

LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 32, 8, 128, 16   # Llama-3-8B's KV shape
SECRET = "bench-secret"


def model_dir(root: pathlib.Path) -> str:
    """Writes the config.json into `root`; returns the directory for ModelConfig."""
    (root / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HEADS * HEAD_DIM, "intermediate_size": 14336,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "num_hidden_layers": LAYERS, "vocab_size": 128256, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}))
    return str(root)


def vllm_config(model: str, socket: str, tokens: int, **extra: object) -> VllmConfig:
    """A CPU VllmConfig of `model` for prompts of up to `tokens` tokens, with kvpool.vllm as its
    KV connector on the kvpoold at `socket`; `extra` adds to or overrides the connector's extra
    config (timeout, load_async, ...)."""
    return VllmConfig(
        model_config=ModelConfig(model=model, tokenizer=model, skip_tokenizer_init=True,
                                 dtype="bfloat16", max_model_len=tokens, seed=0),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=tokens,
                                         enable_chunked_prefill=True, max_model_len=tokens,
                                         is_encoder_decoder=False),
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="KvpoolConnector", kv_connector_module_path="kvpool.vllm",
            kv_role="kv_both", kv_load_failure_policy="recompute",
            kv_connector_extra_config={"socket": socket, "namespace": "bench", "secret": SECRET,
                                       **extra}))
