"""A small MoE decoder stack for the end-to-end train-step benchmark, and the model configurations.

Each block is pre-norm: ``x + attn(norm(x))`` with causal ``scaled_dot_product_attention``, then
``x + moe(norm(x))``. The configs keep the expert-GEMM shapes of MaxText's MoE models (embedding width, expert MLP
width, experts, top-k, shared experts) and shrink layers and sequence so
that one train step fits one GPU and runs in well under a second; they are derived from `ragdot.catalog`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from ragdot import catalog
from ragdot.catalog import MoEModel
from ragdot.moe.layer import MoELayer

__all__ = [
    "ModelConfig", "MODEL_CONFIGS", "LAYER_CONFIGS", "QUICK_CONFIG", "MoEDecoder", "config_from", "configs_from",
    "get_config",
]  # fmt: skip


@dataclass(frozen=True)
class ModelConfig:
    name: str
    dim: int  # embedding width (the expert GEMM's K)
    moe_hidden: int  # expert MLP width (the expert GEMM's N, per projection)
    num_experts: int
    top_k: int
    num_shared: int = 0  # shared experts, each of width moe_hidden
    layers: int = 2
    seq_len: int = 1024
    batch: int = 4
    vocab: int = 4096
    head_dim: int = 128

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    @property
    def heads(self) -> int:
        return max(1, self.dim // self.head_dim)

    def expert_params(self) -> int:
        """Parameters of one layer's routed experts."""
        return self.num_experts * self.dim * 3 * self.moe_hidden

    def params(self) -> int:
        shared = self.dim * 3 * self.moe_hidden * self.num_shared
        per_layer = self.expert_params() + shared + 4 * self.dim * self.dim + self.num_experts * self.dim
        return self.layers * per_layer + 2 * self.vocab * self.dim

    def train_flops(self) -> float:
        """Model FLOPs of one train step (forward + backward = 3x forward), counting routed work only."""
        t, d = self.tokens, self.dim
        attn = 2 * t * d * 4 * d + 2 * 2 * t * self.seq_len * d // 2  # projections + causal scores/values
        moe = 2 * t * self.top_k * d * 3 * self.moe_hidden + 2 * t * d * 3 * self.moe_hidden * self.num_shared
        router = 2 * t * d * self.num_experts
        head = 2 * t * d * self.vocab
        return 3.0 * (self.layers * (attn + moe + router) + head)

    def moe_flops(self) -> float:
        """Routed expert FLOPs of one train step (the grouped GEMMs of every layer, forward and backward)."""
        return 3.0 * self.layers * 2 * self.tokens * self.top_k * self.dim * 3 * self.moe_hidden


def config_from(model: MoEModel) -> ModelConfig:
    """The decoder config of a catalog model (a model without a train step gets ModelConfig's depth and batch)."""
    if model.top_k is None or model.shared is None:
        raise ValueError(f"model {model.name!r} has no layer config: top_k and shared are not given")
    train = {} if model.train is None else asdict(model.train)
    return ModelConfig(model.name, model.dim, model.moe_hidden, model.experts, model.top_k, model.shared, **train)


def configs_from(models: Iterable[MoEModel], tag: str = "moe") -> dict[str, ModelConfig]:
    """Decoder configs by name of the catalog `models` tagged `tag`, in catalog order."""
    return {m.name: config_from(m) for m in catalog.with_tag(tag, models)}


# The train-step set (catalog tag "moe"): the models' expert shapes, reduced in depth and tokens per step.
MODEL_CONFIGS: dict[str, ModelConfig] = configs_from(catalog.MODELS)
#: every config `moe-bench --layer` may take by default: the train-step set, then the layer-only ones
LAYER_CONFIGS: dict[str, ModelConfig] = {**MODEL_CONFIGS, **configs_from(catalog.MODELS, "layer")}
(QUICK_CONFIG,) = configs_from(catalog.MODELS, "quick").values()


def get_config(name: str, **overrides: int) -> ModelConfig:
    """A named config (``LAYER_CONFIGS`` or ``"tiny"``), with fields replaced by non-None overrides."""
    table = {**LAYER_CONFIGS, QUICK_CONFIG.name: QUICK_CONFIG}
    if name not in table:
        raise ValueError(f"model config {name!r} is unknown; expected one of {', '.join(table)}")
    return replace(table[name], **{k: v for k, v in overrides.items() if v is not None})


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, *, dtype=None, device=None) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False, dtype=dtype, device=device)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, heads, S, head_dim]
        return self.out(o.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, moe_kwargs: dict, *, dtype=None, device=None) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.dim, dtype=dtype, device=device)
        self.attn = Attention(cfg, dtype=dtype, device=device)
        self.norm2 = nn.RMSNorm(cfg.dim, dtype=dtype, device=device)
        self.moe = MoELayer(
            cfg.dim, cfg.moe_hidden, cfg.num_experts, cfg.top_k, num_shared_experts=cfg.num_shared,
            dtype=dtype, device=device, **moe_kwargs,
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.moe(self.norm2(x))


class MoEDecoder(nn.Module):
    """Token embedding, ``cfg.layers`` attention + MoE blocks, final norm and LM head."""

    def __init__(self, cfg: ModelConfig, *, dtype=None, device=None, **moe_kwargs) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim, dtype=dtype, device=device)
        self.blocks = nn.ModuleList(
            Block(cfg, moe_kwargs, dtype=dtype, device=device) for _ in range(cfg.layers)
        )
        self.norm = nn.RMSNorm(cfg.dim, dtype=dtype, device=device)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False, dtype=dtype, device=device)

    @property
    def moe_layers(self) -> list[MoELayer]:
        return [block.moe for block in self.blocks]

    def set_moe(self, **settings: object) -> None:
        """Set attributes (path, backend, capacity_factor, routing_impl) on every MoE layer."""
        for layer in self.moe_layers:
            for key, value in settings.items():
                setattr(layer, key, value)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens int [B, S] -> logits [B, S, vocab]."""
        # index_select rather than nn.Embedding's backward, which may synchronise with the host (the bench
        # captures whole train steps in CUDA graphs); its gradient is an index_add
        x = self.embed.weight.index_select(0, tokens.reshape(-1)).view(*tokens.shape, self.cfg.dim)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy (float32) plus every layer's router losses."""
        logits = self(tokens[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
        return ce + sum(layer.aux_loss + layer.z_loss for layer in self.moe_layers)
