"""The model catalog and the tables derived from it: `ragdot.shapes.SHAPES`, `ragdot.moe.model.MODEL_CONFIGS`
(with `QUICK_CONFIG`) and the MXFP8 bench's problems. The pinned tables below are the values these tables held
before they were derived from `ragdot.catalog`; a change to them is a change of the recorded benchmarks."""

from __future__ import annotations

import dataclasses

from ragdot.moe.model import MODEL_CONFIGS, QUICK_CONFIG, get_config
from ragdot.mxfp8 import bench as mx
from ragdot.shapes import SHAPES, TAGS, get_shape, shapes_with_tag

_SEED, _ANCHOR, _TINY = ("seed",), ("seed", "anchor"), ("tiny",)

#: name, M, K, N, E, tags
PINNED_SHAPES = [
    ("deepseek2-16b", 3840, 2048, 1408, 64, _ANCHOR),
    ("deepseek3-test", 5120, 512, 512, 256, _ANCHOR),
    ("gemma4-26b", 10240, 2816, 704, 128, _ANCHOR),
    ("qwen3-30b-a3b", 10240, 2048, 768, 128, _ANCHOR),
    ("qwen3-235b-a22b", 20480, 4096, 1536, 128, _ANCHOR),
    ("llama4-17b-16e", 1280, 5120, 8192, 16, _ANCHOR),
    ("mixtral-8x7b", 15360, 6144, 20480, 32, _ANCHOR),
    ("gpt-oss-120b-like", 10240, 2880, 2880, 128, _ANCHOR),
    ("mixtral-8x7b-large", 40960, 8192, 28672, 64, _SEED),
    ("deepseek-v2-like", 1920, 5120, 1536, 160, _SEED),
    ("qwen3-next-like", 6400, 2048, 512, 512, _SEED),
    ("tiny-8e", 192, 64, 96, 8, _TINY),
    ("tiny-odd", 200, 48, 72, 10, _TINY),
]

#: name, dim, moe_hidden, num_experts, top_k, num_shared, layers, seq_len, batch, vocab, head_dim
PINNED_CONFIGS = [
    ("deepseek2-16b", 2048, 1408, 64, 6, 2, 4, 512, 8, 4096, 128),
    ("deepseek3-test", 512, 512, 256, 8, 1, 4, 512, 8, 4096, 128),
    ("deepseek3-671b-reduced", 7168, 2048, 32, 8, 1, 2, 512, 4, 4096, 128),
    ("gemma4-26b", 2816, 704, 128, 8, 1, 2, 1024, 4, 4096, 128),
    ("qwen3-30b-a3b", 2048, 768, 128, 8, 0, 2, 1024, 4, 4096, 128),
    ("qwen3-235b-a22b", 4096, 1536, 128, 8, 0, 2, 2048, 1, 4096, 128),
    ("llama4-17b-16e", 5120, 8192, 16, 1, 1, 2, 1024, 4, 4096, 128),
    ("mixtral-8x7b", 6144, 20480, 32, 4, 0, 1, 1024, 2, 4096, 128),
    ("mixtral-8x7b-large", 8192, 28672, 64, 8, 0, 1, 1024, 2, 4096, 128),
]
PINNED_QUICK = ("tiny", 64, 32, 8, 2, 1, 2, 32, 2, 128, 16)

#: name -> (N, K, experts, tokens)
PINNED_MXFP8 = {
    "16B": (1408, 2048, 8, 195_840),
    "671B-4096": (4096, 7168, 32, 258_304),
    "671B-7168": (7168, 7168, 32, 126_976),
    "tiny": (128, 192, 4, 2_048),
}
PINNED_MXFP8_DEFAULT = ("16B", "671B-4096", "671B-7168")


def test_shapes_are_the_pinned_table():
    assert [(s.name, s.M, s.K, s.N, s.E, s.tags) for s in SHAPES] == PINNED_SHAPES
    assert TAGS == ("seed", "anchor", "tiny")
    assert [s.name for s in shapes_with_tag("anchor")] == [r[0] for r in PINNED_SHAPES if "anchor" in r[5]]
    assert get_shape("gpt-oss-120b-like").dims == (10240, 2880, 2880, 128)


def test_model_configs_are_the_pinned_table():
    assert [dataclasses.astuple(c) for c in MODEL_CONFIGS.values()] == PINNED_CONFIGS
    assert list(MODEL_CONFIGS) == [r[0] for r in PINNED_CONFIGS]
    assert dataclasses.astuple(QUICK_CONFIG) == PINNED_QUICK
    assert get_config("tiny") == QUICK_CONFIG and get_config("mixtral-8x7b", layers=3).layers == 3


def test_mxfp8_problems_are_the_pinned_table():
    assert mx.SHAPES == PINNED_MXFP8 and list(mx.SHAPES) == list(PINNED_MXFP8)
    assert mx.DEFAULT_SHAPES == PINNED_MXFP8_DEFAULT
