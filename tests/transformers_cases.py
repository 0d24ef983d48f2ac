"""What the transformers integration tests share (skipped without transformers >= 5): tiny random configs of
the MoE families, the models built from them on the CPU in float32, and ragdot's experts registered under
"ragdot" and "ragdot_fused" for every test module that imports `_registered` (an autouse fixture)."""

from __future__ import annotations

import pytest
import torch

from helpers import needs_fused_block

transformers = pytest.importorskip("transformers", minversion="5")

import ragdot.integrations.transformers as rt  # noqa: E402

IMPLS = ("ragdot", "grouped_mm", "eager")
TOL = dict(rtol=1e-4, atol=1e-5)

_COMMON = dict(
    vocab_size=96,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

# family -> (config class, causal-LM class, config overrides)
FAMILIES = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2, head_dim=8),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(intermediate_size=24, num_local_experts=6, num_experts_per_tok=2, head_dim=8),
    ),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(intermediate_size=24, num_experts=6, num_experts_per_tok=2)),
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            num_key_value_heads=4,
            intermediate_size=48,
            moe_intermediate_size=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
        ),
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(intermediate_size=24, num_local_experts=6, num_experts_per_tok=2, head_dim=8, sliding_window=8),
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _registered():
    rt.register()
    rt.register(rt.FUSED_NAME, fused=True)


def _has_triton() -> bool:
    from ragdot.moe import routing_kernels

    return routing_kernels.HAS_TRITON


def _needs_triton(cpu_model: bool = True):
    needs_fused_block(cpu_model)


def _classes(family: str):
    config_name, model_name, overrides = FAMILIES[family]
    if not hasattr(transformers, config_name) or not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    return getattr(transformers, config_name), getattr(transformers, model_name), overrides


def _randomize_biases(module: torch.nn.Module, seed: int) -> None:
    """Expert biases start at zero; random ones make the bias path count."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "experts" in name and name.endswith("_bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def _model(family: str, seed: int = 0, **extra) -> torch.nn.Module:
    config_cls, model_cls, overrides = _classes(family)
    config = config_cls(**{**_COMMON, **overrides, **extra})
    torch.manual_seed(seed)
    model = model_cls(config).float()
    _randomize_biases(model, seed)
    return model


def _experts(family: str, seed: int = 0) -> torch.nn.Module:
    model = _model(family, seed)
    for module in model.modules():
        if type(module).__name__.endswith("Experts") and hasattr(module, "down_proj"):
            return module
    raise AssertionError(f"{family} has no experts module")


def _routing(tokens: int, top_k: int, num_experts: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(tokens)])
    w = torch.softmax(torch.randn(tokens, top_k, generator=gen), dim=-1)
    return idx, w


def _hidden(module: torch.nn.Module) -> int:
    up = module.gate_up_proj if getattr(module, "has_gate", True) else module.up_proj
    return up.shape[1] if module.is_transposed else up.shape[2]
