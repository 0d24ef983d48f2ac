"""The model catalog and the tables derived from it: `ragdot.shapes.SHAPES`, `ragdot.moe.model.MODEL_CONFIGS`
(with `QUICK_CONFIG`) and the MXFP8 bench's problems. The pinned tables below are the values these tables held
before they were derived from `ragdot.catalog`; a change to them is a change of the recorded benchmarks."""

from __future__ import annotations

import dataclasses

import pytest

from ragdot import catalog
from ragdot.bench import mxfp8 as mx
from ragdot.catalog import MODELS, MoEModel, TrainStep, WgradProblem
from ragdot.moe.model import LAYER_CONFIGS, MODEL_CONFIGS, QUICK_CONFIG, configs_from, get_config
from ragdot.shapes import SHAPES, TAGS, get_shape, shapes_from, shapes_with_tag

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


# ---------------------------------------------------------------------------------------------- the catalog
def test_a_model_added_to_a_copy_of_the_catalog_appears_in_every_derived_table():
    new = MoEModel("new-moe", 1024, 512, 64, 4, 1, (4096,), train=TrainStep(2, 256, 4),
                   tags=("seed", "moe", "mxfp8"), mxfp8=(WgradProblem("new-wgrad", 512, 1024, 8, 8192),))  # fmt: skip
    models = catalog.check_catalog((*MODELS, new))
    shapes = shapes_from(models)
    assert shapes[:-1] == SHAPES and (shapes[-1].name, shapes[-1].dims, shapes[-1].tags) == (
        "new-moe", (4096, 1024, 512, 64), ("seed",))  # fmt: skip
    configs = configs_from(models)
    assert list(configs) == [*MODEL_CONFIGS, "new-moe"]
    assert dataclasses.astuple(configs["new-moe"]) == ("new-moe", 1024, 512, 64, 4, 1, 2, 256, 4, 4096, 128)
    assert [p.name for p in catalog.mxfp8_problems(models, tiny=False)] == [*mx.DEFAULT_SHAPES, "new-wgrad"]
    # and the tables of the shipped catalog do not see it
    assert "new-moe" not in MODEL_CONFIGS and "new-moe" not in {s.name for s in SHAPES}


def test_gpt_oss_like_is_a_layer_config_outside_the_train_step_set():
    cfg = get_config("gpt-oss-like")
    assert (cfg.dim, cfg.moe_hidden, cfg.num_experts, cfg.top_k, cfg.num_shared) == (2880, 2880, 128, 4, 0)
    assert "gpt-oss-like" not in MODEL_CONFIGS and list(LAYER_CONFIGS) == [*MODEL_CONFIGS, "gpt-oss-like"]
    gemm = get_shape("gpt-oss-120b-like")
    assert (cfg.dim, cfg.moe_hidden, cfg.num_experts) == (gemm.K, gemm.N, gemm.E)


def test_every_catalog_config_matches_its_gemm_shape():
    for model in MODELS:
        for name, m, k, n, e in model.shapes():
            assert get_shape(name).dims == (m, k, n, e)
        if model.name in LAYER_CONFIGS:
            c = LAYER_CONFIGS[model.name]
            assert (c.dim, c.moe_hidden, c.num_experts) == (model.dim, model.moe_hidden, model.experts)


def test_several_token_counts_name_their_shapes_by_count():
    model = MoEModel("two-m", 64, 32, 8, gemm_tokens=(128, 256))
    assert [s.name for s in shapes_from([model])] == ["two-m-m128", "two-m-m256"]


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: MoEModel("x", 0, 32, 8), "dim"),
        (lambda: MoEModel("x", 64, 32, 8, gemm_tokens=(0,)), "gemm_tokens"),
        (lambda: MoEModel("x", 64, 32, 8, 2, -1), "shared"),
        (lambda: MoEModel("x", 64, 32, 8, tags=("big",)), "unknown"),
        (lambda: MoEModel("x", 64, 32, 8, 2, 0, tags=("moe",)), "train"),
        (lambda: MoEModel("x", 64, 32, 8, tags=("layer",)), "top_k"),
        (lambda: MoEModel("x", 64, 32, 8, tags=("seed",)), "gemm_tokens"),
        (lambda: MoEModel("x", 64, 32, 8, tags=("mxfp8",)), "mxfp8"),
        (lambda: TrainStep(2, 0, 1), "seq_len"),
        (lambda: catalog.check_catalog((*MODELS, MODELS[0])), "more than once"),
        (lambda: catalog.check_catalog(m for m in MODELS if "quick" not in m.tags), "quick"),
        (lambda: catalog.with_tag("big"), "tag"),
        (lambda: catalog.get_model("nope"), "nope"),
    ],
)
def test_catalog_errors_name_the_field(build, needle):
    with pytest.raises(ValueError, match=needle):
        build()
