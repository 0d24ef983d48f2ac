"""experts_implementation="ragdot" inside Hugging Face transformers (skipped without transformers >= 5): the
experts modules alone (the layout flags: biases, transposed and untransposed weights, no gate, post-expert norm;
expert-parallel sentinels; weights in another dtype and under autocast; the compiled custom op). Whole models:
test_transformers_integration.py.
"""

from __future__ import annotations

import pytest
import torch

from transformers_cases import (  # _registered: the autouse fixture that registers ragdot's experts
    TOL,
    _experts,
    _hidden,
    _needs_triton,
    _registered,  # noqa: F401
    _routing,
    rt,
    transformers,
)


# ------------------------------------------------------------------------------- experts modules directly
def _experts_step(module, impl, x, idx, w):
    module.config._experts_implementation = impl
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    y = module(x, idx, w)
    y.backward(torch.linspace(-1, 1, y.numel(), device=y.device).view_as(y))
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    return y.detach(), x.grad, w.grad, grads


def _assert_same(a, b, what):
    ya, xa, wa, ga = a
    yb, xb, wb, gb = b
    torch.testing.assert_close(ya, yb, **TOL, msg=f"output vs {what}")
    torch.testing.assert_close(xa, xb, **TOL, msg=f"input grad vs {what}")
    torch.testing.assert_close(wa, wb, **TOL, msg=f"routing-weight grad vs {what}")
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], **TOL, msg=f"grad of {name} vs {what}")


@pytest.mark.parametrize(
    "family, impl, flag",
    [
        ("qwen3_moe", "ragdot", True),
        ("gpt_oss", "ragdot", True),
        ("qwen3_moe", "ragdot", None),
        ("qwen3_moe", "ragdot_fused", True),
        ("qwen3_moe", "ragdot_fused", None),
    ],
    ids=["qwen3", "gpt_oss", "qwen3-no-flag", "qwen3-fused", "qwen3-fused-no-flag"],
)
def test_expert_parallel_sentinels_add_nothing(family, impl, flag):
    """Off-rank choices carry the local id num_experts and weight 0 (transformers' EP dispatch). Without the
    ``_is_expert_parallel`` attribute (transformers 5.17 has none) sentinels are handled all the time."""
    if impl == rt.FUSED_NAME:
        _needs_triton()
    module = _experts(family)
    if flag is None:
        if hasattr(module, "_is_expert_parallel"):
            del module._is_expert_parallel
    else:
        module._is_expert_parallel = flag
    e = module.num_experts
    idx, w = _routing(10, 2, e, seed=5)
    off_rank = torch.zeros_like(idx, dtype=torch.bool)
    off_rank[::3, 0] = True
    off_rank[1, :] = True  # a token with no local expert at all
    idx = idx.masked_fill(off_rank, e)
    w = w.masked_fill(off_rank, 0.0)
    x = torch.randn(10, _hidden(module))
    got = _experts_step(module, impl, x, idx, w)
    if flag is not None:  # transformers' own grouped_mm reads the flag where it has one
        _assert_same(got, _experts_step(module, "grouped_mm", x, idx, w), "grouped_mm")
    assert torch.all(got[2][off_rank] == 0), "off-rank routing weights got a gradient"
    # the same tokens routed only to local experts, the off-rank choices dropped (weight 0 on expert 0)
    module._is_expert_parallel = False
    local = _experts_step(module, impl, x, idx.masked_fill(off_rank, 0), w)
    torch.testing.assert_close(got[0], local[0], **TOL)
    torch.testing.assert_close(got[1], local[1], **TOL)


@pytest.mark.parametrize("tokens", [0, 7])
def test_all_to_all_hand_off_top1_unit_weights(tokens):
    """transformers' all-to-all expert parallelism hands each rank its own rows as top-1 with unit weights."""
    module = _experts("gpt_oss")
    module._is_expert_parallel = True
    idx = torch.arange(tokens).remainder(module.num_experts).unsqueeze(-1)
    w = torch.ones(tokens, 1)
    x = torch.randn(tokens, _hidden(module))
    got = _experts_step(module, "ragdot", x, idx, w)
    assert got[0].shape == (tokens, _hidden(module))
    _assert_same(got, _experts_step(module, "grouped_mm", x, idx, w), "grouped_mm")


def test_weights_in_another_dtype_than_the_input():
    """bfloat16 experts fed float32 activations (as under autocast): computed in bfloat16, returned in float32."""
    module = _experts("qwen3_moe").to(torch.bfloat16)
    idx, w = _routing(16, 2, module.num_experts, seed=6)
    x = torch.randn(16, _hidden(module))
    outs = {}
    for impl in ("ragdot", "grouped_mm"):
        module.config._experts_implementation = impl
        with torch.no_grad():
            outs[impl] = module(x, idx, w.to(torch.bfloat16))
    assert outs["ragdot"].dtype == torch.float32
    torch.testing.assert_close(outs["ragdot"], outs["grouped_mm"], rtol=2e-2, atol=2e-2)


def test_fused_block_under_autocast_takes_float32_weights_as_master_weights(monkeypatch):
    """float32 experts in a 16-bit autocast region (a Trainer's mixed precision): "ragdot_fused" runs the fused
    block on x cast to the region's dtype with the float32 weights as master weights (their gradients float32),
    and agrees with the ragged_dot path ("ragdot", whose products cast the weights per call)."""
    _needs_triton(cpu_model=not torch.cuda.is_available())
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    low = torch.bfloat16 if dev.type == "cuda" else torch.float16  # the Triton interpreter: float16 dots only
    module = _experts("qwen3_moe").to(dev)
    idx, w = _routing(24, 2, module.num_experts, seed=8)
    idx, w = idx.to(dev), w.to(dev)
    x = torch.randn(24, _hidden(module)).to(dev)
    seen = []
    real = rt.fused_experts
    monkeypatch.setattr(rt, "fused_experts", lambda xx, *a: seen.append((xx.dtype, a[-1].dtype)) or real(xx, *a))
    with torch.autocast(dev.type, dtype=low):
        assert rt.fused_applies(module, x)
        fused = _experts_step(module, rt.FUSED_NAME, x, idx, w)
        plain = _experts_step(module, "ragdot", x, idx, w)
    assert seen == [(low, torch.float32)]
    assert fused[0].dtype == torch.float32 and all(g.dtype == torch.float32 for g in fused[3].values())
    tol = dict(rtol=2e-2, atol=2e-3) if low == torch.float16 else dict(rtol=5e-2, atol=1e-2)
    torch.testing.assert_close(fused[0], plain[0], **tol)
    torch.testing.assert_close(fused[1], plain[1], **tol)
    for name, g in fused[3].items():
        torch.testing.assert_close(g, plain[3][name], **tol, msg=name)
    assert not rt.fused_applies(module, x.to(low))  # outside a region: one dtype, as before


def test_ragged_dot_path_under_autocast_keeps_float32_weights_as_master_weights():
    """gpt-oss (biases and its own gate: the ragged_dot path) with float32 weights in a 16-bit autocast region:
    the products run in the region's dtype and the expert weights' gradients are float32 products (ragdot's
    master operands), close to transformers' "grouped_mm" (which turns autocast off and runs float32)."""
    low = torch.bfloat16
    module = _experts("gpt_oss")
    idx, w = _routing(24, 2, module.num_experts, seed=9)
    x = torch.randn(24, _hidden(module))
    with torch.autocast("cpu", dtype=low):
        got = _experts_step(module, "ragdot", x, idx, w)
        ref = _experts_step(module, "grouped_mm", x, idx, w)
    for name in ("gate_up_proj", "down_proj"):
        g = got[3][name]
        assert g.dtype == torch.float32 and not torch.equal(g, g.to(low).float()), name
        torch.testing.assert_close(g, ref[3][name], rtol=3e-2, atol=3e-2, msg=name)
    torch.testing.assert_close(got[0], ref[0], rtol=3e-2, atol=3e-2)


def _standalone(model_module: str, config_name: str, experts_name: str, **config_kwargs) -> torch.nn.Module:
    try:
        mod = __import__(f"transformers.models.{model_module}.modeling_{model_module}", fromlist=[experts_name])
        config_mod = __import__(
            f"transformers.models.{model_module}.configuration_{model_module}", fromlist=[config_name]
        )
    except ImportError as e:
        pytest.skip(f"transformers {transformers.__version__} has no {model_module}: {e}")
    if not hasattr(mod, experts_name) or not hasattr(config_mod, config_name):
        pytest.skip(f"transformers {transformers.__version__} has no {experts_name}")
    config = getattr(config_mod, config_name)(**config_kwargs)
    torch.manual_seed(7)
    module = getattr(mod, experts_name)(config).float()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.2 * torch.randn_like(p) + (1.0 if p.dim() == 1 else 0.0))
    return module


@pytest.mark.parametrize(
    "case",
    [
        ("nemotron_h", "NemotronHConfig", "NemotronHExperts", dict(n_routed_experts=6, moe_intermediate_size=16)),
        (
            "muse_spark",
            "MuseSparkTextConfig",
            "MuseSparkExperts",
            dict(
                num_local_experts=6,
                moe_intermediate_size=16,
                moe_hidden_size=32,
                num_attention_heads=4,
                num_key_value_heads=2,
            ),
        ),
    ],
    ids=["no_gate", "post_expert_norm"],
)
def test_other_layout_flags_match_eager_and_grouped_mm(case):
    model_module, config_name, experts_name, kwargs = case
    module = _standalone(model_module, config_name, experts_name, hidden_size=32, **kwargs)
    idx, w = _routing(12, 2, module.num_experts, seed=8)
    x = torch.randn(12, _hidden(module))
    got = _experts_step(module, "ragdot", x, idx, w)
    _assert_same(got, _experts_step(module, "grouped_mm", x, idx, w), "grouped_mm")
    _assert_same(got, _experts_step(module, "eager", x, idx, w), "eager")


def test_layout_flags_read_from_the_instance_then_the_class_and_through_properties():
    class Experts(torch.nn.Module):
        has_bias = True

        @property
        def is_transposed(self):
            return self._t

    m = Experts()
    m._t = False
    assert rt._flag(m, "has_bias", False) is True  # the class's
    m.has_bias = False
    assert rt._flag(m, "has_bias", True) is False  # the instance's wins
    assert rt._flag(m, "is_transposed", True) is False  # a property is evaluated, not taken for its truth
    assert rt._flag(m, "has_post_expert_norm", False) is False and rt._flag(m, "_is_expert_parallel", True) is True
    m.register_buffer("has_gate", None)  # not a flag: buffers and parameters are never read as one
    assert rt._flag(m, "has_gate", True) is True

    class Proxy(torch.nn.Module):  # a wrapper that forwards lookups it cannot answer: its answers count
        def __getattr__(self, name):
            if name == "is_transposed":
                return True
            return super().__getattr__(name)

    assert rt._flag(Proxy(), "is_transposed", False) is True and rt._flag(Proxy(), "has_bias", False) is False


@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast"])
def test_compiled_experts_call_the_custom_op_directly_except_under_autocast(autocast, monkeypatch):
    """Traced (compiled) experts products go straight to the problem's custom op (`api._traced_ragged_m`: the
    operands are ragdot's own, so there is nothing to check, and every check traced would be a guard in each
    compiled step); under autocast they keep ragged_dot's path, which casts to the region's dtype."""
    module = _experts("gpt_oss")
    idx, w = _routing(16, 2, module.num_experts, seed=3)
    x = torch.randn(16, _hidden(module))
    calls = []

    def spy(*args):
        calls.append(args[0].dtype)
        return api_traced(*args)

    api_traced = rt._traced_ragged_m
    monkeypatch.setattr(rt, "_traced_ragged_m", spy)
    fn = rt.make_experts_forward(None)
    region = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with torch.no_grad(), region:
        want = fn(module, x, idx, w)
        torch._dynamo.reset()
        got = torch.compile(lambda a, i, s: fn(module, a, i, s), backend="aot_eager", fullgraph=True)(x, idx, w)
    torch._dynamo.reset()
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, **(dict(rtol=2e-2, atol=2e-2) if autocast else TOL))
    assert calls == ([] if autocast else [torch.float32, torch.float32])
