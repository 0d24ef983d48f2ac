"""experts_implementation="ragdot" inside Hugging Face transformers (skipped without transformers >= 5): whole
models.

Tiny random configs on the CPU in float32: "ragdot" against transformers' own "grouped_mm" and "eager" on the
logits, the loss and every parameter gradient; greedy generation with a KV cache; torch.compile, torch.export and
AOTInductor; registration and its errors; bfloat16 on CUDA. The experts modules alone: test_transformers_experts.py.
"""

from __future__ import annotations

import pytest
import torch

from transformers_cases import (  # _registered: the autouse fixture that registers ragdot's experts
    _COMMON,
    FAMILIES,
    IMPLS,
    TOL,
    _experts,
    _has_triton,
    _hidden,
    _model,
    _needs_triton,
    _randomize_biases,
    _registered,  # noqa: F401
    _routing,
    rt,
    transformers,
)


def _step(model: torch.nn.Module, impl: str, ids: torch.Tensor):
    model.set_experts_implementation(impl)
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_loss_and_every_gradient_match(family):
    model = _model(family)
    ids = torch.randint(3, _COMMON["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    results = {impl: _step(model, impl, ids) for impl in IMPLS}
    logits, loss, grads = results["ragdot"]
    expert_grads = [n for n in grads if ".experts." in n]
    assert expert_grads, "no expert parameter received a gradient"
    assert set(grads) == {n for n, p in model.named_parameters() if p.requires_grad}
    for other in ("grouped_mm", "eager"):
        o_logits, o_loss, o_grads = results[other]
        torch.testing.assert_close(logits, o_logits, **TOL, msg=f"logits vs {other}")
        torch.testing.assert_close(loss, o_loss, **TOL, msg=f"loss vs {other}")
        assert set(grads) == set(o_grads)
        for name, g in grads.items():
            torch.testing.assert_close(g, o_grads[name], **TOL, msg=f"grad of {name} vs {other}")
    assert all(grads[n].abs().sum() > 0 for n in expert_grads)


# More transformers families whose experts use the decorator (transformers 5.17), built from their default config
# with small widths: each one's own layout flags, activation, attention and router around ragdot's experts.
# family -> what it needs beyond `_SMALL` (hybrid models: enough layers for one attention layer)
MORE_FAMILIES = {
    "afmoe": {}, "axk1": {}, "axk2": {}, "cohere2_moe": {}, "deepseek_v2": {}, "deepseek_v32": {}, "deepseek_v4": {},
    "dots1": dict(n_shared_experts=1, layer_types=["full_attention"] * 2, max_window_layers=2),
    "ernie4_5_moe": {}, "exaone_moe": {}, "flex_olmo": {}, "glm4_moe": {}, "glm4_moe_lite": {}, "glm_moe_dsa": {},
    "granitemoehybrid": dict(layer_types=["linear_attention", "attention"], mamba_n_heads=4, mamba_d_head=16,
                             mamba_d_state=16, mamba_chunk_size=8, shared_intermediate_size=16),
    "kimi_linear": dict(num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2,
                        mlp_layer_types=["sparse"] * 4, num_experts_per_token=2, linear_head_dim=8,
                        linear_num_heads=4, num_shared_experts=1),
    "lfm2_moe": dict(num_dense_layers=1, layer_types=["conv", "full_attention"]),
    "gemma4": dict(enable_moe_block=True, top_k_experts=2, layer_types=["sliding_attention", "full_attention"],
                   vocab_size_per_layer_input=128, hidden_size_per_layer_input=8, per_layer_config={}),
    "granitemoe": {}, "granitemoe_swa": {}, "granitemoeshared": {}, "hunyuan_v1_moe": {}, "hy_v3": {}, "hy_v4": {},
    "inkling": {}, "jamba": dict(num_hidden_layers=8), "laguna": {}, "mellum": {}, "mimo_v2_flash": {},
    "minimax": {}, "minimax_m2": {}, "mistral4": {}, "nemotron_h": {}, "phimoe": {}, "qwen2_moe": {},
    "qwen3_5_moe": dict(num_hidden_layers=4), "qwen3_next": dict(num_hidden_layers=4), "solar_open": {},
    "zaya": dict(num_experts_per_tok=1),
}
_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
              moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=6, num_local_experts=6,
              n_routed_experts=6, num_experts_per_tok=2, vocab_size=128, head_dim=8, max_position_embeddings=64,
              first_k_dense_replace=0, n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
              qk_nope_head_dim=8, v_head_dim=8, sliding_window=8, moe_layer_freq=1, decoder_sparse_step=1,
              mlp_only_layers=[], tie_word_embeddings=False)


def _small_model(family: str) -> torch.nn.Module:
    """The family's causal LM with `_SMALL`'s widths (and the family's extras) for the fields its config has:
    passed to the config's constructor, or set on the text config of a composite one."""
    import importlib

    try:
        module = importlib.import_module(f"transformers.models.{family}")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no {family}")
    model_cls = next(getattr(module, n) for n in dir(module) if n.endswith("ForCausalLM"))
    default = model_cls.config_class()
    small = {**_SMALL, **MORE_FAMILIES[family]}
    fields = default.to_dict()  # (not hasattr: gemma4's config raises on reading a per-layer field globally)
    if "kv_lora_rank" in fields:  # latent attention: its head widths come from the rope / lora fields
        small.pop("head_dim")
        small["num_key_value_heads"] = small["num_attention_heads"]
    if fields.get("text_config") is None:
        config = text = model_cls.config_class(**{k: v for k, v in small.items() if k in fields})
    else:
        config, text = default, default.text_config
        for key, value in small.items():
            if hasattr(text, key):
                setattr(text, key, value)
    if getattr(text, "pad_token_id", None) is not None and text.pad_token_id >= _SMALL["vocab_size"]:
        text.pad_token_id = 0
    torch.manual_seed(0)
    model = model_cls(config).float().eval()  # gradients still flow; no dropout or router jitter (phimoe) to differ
    _randomize_biases(model, 0)
    return model


@pytest.mark.parametrize("impl", [rt.NAME, rt.FUSED_NAME])
@pytest.mark.parametrize("family", MORE_FAMILIES)
def test_more_families_match_grouped_mm_through_ragdot_s_experts(family, impl, monkeypatch):
    """Logits, loss and every parameter gradient of "ragdot" and "ragdot_fused" (the fused kernels wherever the
    layout is plain SwiGLU, the ragged_dot path elsewhere) against "grouped_mm", and ragdot's experts really ran
    (counted in transformers' registry)."""
    from transformers.integrations.moe import ExpertsInterface

    if impl == rt.FUSED_NAME:
        _needs_triton()
    model = _small_model(family)
    registry = ExpertsInterface._global_mapping
    calls = []
    monkeypatch.setitem(registry, impl, lambda *a, fn=registry[impl], **k: calls.append(1) or fn(*a, **k))
    ids = torch.randint(3, _SMALL["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    logits, loss, grads = _step(model, impl, ids)
    assert calls, "ragdot's experts forward never ran"
    o_logits, o_loss, o_grads = _step(model, "grouped_mm", ids)
    torch.testing.assert_close(logits, o_logits, **TOL)
    torch.testing.assert_close(loss, o_loss, **TOL)
    assert set(grads) == set(o_grads) and any(".experts." in n for n in grads)
    for name, g in grads.items():
        torch.testing.assert_close(g, o_grads[name], **TOL, msg=f"grad of {name}")


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "gpt_oss"])
def test_fused_variant_matches_grouped_mm(family):
    """"ragdot_fused": the fused kernels where the layout is plain SwiGLU (Qwen3-MoE, DeepSeek-V3), the
    ragged_dot path where it is not (gpt-oss: biases and its own gate)."""
    _needs_triton()
    model = _model(family)
    experts = next(m for m in model.modules() if type(m).__name__.endswith("Experts"))
    x = torch.zeros(1, _hidden(experts))
    assert rt.fused_applies(experts, x) == (family != "gpt_oss")
    ids = torch.randint(3, _COMMON["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    logits, loss, grads = _step(model, rt.FUSED_NAME, ids)
    o_logits, o_loss, o_grads = _step(model, "grouped_mm", ids)
    torch.testing.assert_close(logits, o_logits, **TOL)
    torch.testing.assert_close(loss, o_loss, **TOL)
    assert set(grads) == set(o_grads)
    for name, g in grads.items():
        torch.testing.assert_close(g, o_grads[name], **TOL, msg=f"grad of {name}")


def test_the_default_runs_the_fused_block_where_it_is_preferred(monkeypatch):
    """register()'s default (fused=None) takes the fused block where it applies and `preferred` says it measured
    faster, with ragged_dot's auto backend and outside torch.compile; never for a layout it does not apply to."""
    _needs_triton()
    seen = []
    monkeypatch.setattr(rt, "preferred", lambda x, top_k, w_up, w_down, **kw: seen.append(top_k) or True)
    for family, applies in (("qwen3_moe", True), ("gpt_oss", False)):
        model = _model(family)
        experts = next(m for m in model.modules() if type(m).__name__.endswith("Experts"))
        x = torch.zeros(4, _hidden(experts))
        assert rt._use_fused(experts, x, 2, None, None) == applies
        assert rt._use_fused(experts, x, 2, True, None) == applies
        assert not rt._use_fused(experts, x, 2, None, "torch")  # a backend named: ragged_dot on it
        assert not rt._use_fused(experts, x, 2, False, None)
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        assert not rt._use_fused(experts, x, 2, None, None)
        assert rt._use_fused(experts, x, 2, True, None) == applies
        monkeypatch.undo()
        monkeypatch.setattr(rt, "preferred", lambda x, top_k, w_up, w_down, **kw: seen.append(top_k) or True)
    assert seen == [2]  # asked once: for the layout it applies to, fused=None, eager
    monkeypatch.setattr(rt, "preferred", lambda *a, **kw: False)
    experts = next(m for m in _model("qwen3_moe").modules() if type(m).__name__.endswith("Experts"))
    assert not rt._use_fused(experts, torch.zeros(4, _hidden(experts)), 2, None, None)
    with pytest.raises(TypeError, match="fused"):
        rt.make_experts_forward(None, fused="yes")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_generation_with_kv_cache_gives_the_same_tokens(family):
    model = _model(family, seed=2).eval()
    prompt = torch.randint(3, _COMMON["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(3))
    tokens = {}
    fused = family == "qwen3_moe" and _has_triton()  # one family: the interpreter runs the fused kernels slowly
    for impl in (*IMPLS, rt.FUSED_NAME) if fused else IMPLS:
        model.set_experts_implementation(impl)
        with torch.no_grad():
            tokens[impl] = model.generate(
                prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0
            )
    assert tokens["ragdot"].shape == (2, 11)
    assert torch.equal(tokens["ragdot"], tokens["grouped_mm"])
    assert torch.equal(tokens["ragdot"], tokens["eager"])
    assert torch.equal(tokens.get(rt.FUSED_NAME, tokens["ragdot"]), tokens["ragdot"])


def test_a_model_exported_and_compiled_ahead_of_time_matches_eager():
    """torch.export and AOTInductor of a Qwen3-MoE model running "ragdot" experts (the C++ wrapper calls ragdot's
    ops through its proxy executor: `ragdot.inductor_lowering`): the logits of eager "ragdot" calls."""
    import shutil

    from ragdot.inductor_lowering import AOT_MIN_TORCH, torch_release

    if not hasattr(torch._inductor, "aoti_compile_and_package") or not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("needs AOTInductor packaging and a C++ compiler")
    if torch_release() < AOT_MIN_TORCH:  # torch 2.11 crashes loading the package (ragdot refuses to compile it)
        pytest.skip(f"AOTInductor with ragdot's ops needs torch >= {AOT_MIN_TORCH}")
    model = _model("qwen3_moe", seed=4).eval()
    model.set_experts_implementation("ragdot")
    ids = torch.randint(3, _COMMON["vocab_size"], (1, 12), generator=torch.Generator().manual_seed(5))

    class Logits(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.inner(ids, use_cache=False).logits

    wrapped = Logits(model)
    with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
        want = wrapped(ids)
        program = torch.export.export(wrapped, (ids,))
        assert torch.equal(program.module()(ids), want)
        compiled = torch._inductor.aoti_load_package(torch._inductor.aoti_compile_and_package(program))
        torch.testing.assert_close(compiled(ids), want)


@pytest.mark.parametrize("impl", ["ragdot", "ragdot_fused"])
def test_torch_compile_fullgraph_forward_and_backward(impl):
    """aot_eager traces the whole model through dynamo and AOT autograd in seconds on the CPU; inductor's CPU
    code generation takes several times as long, so it runs only in the GPU test below."""
    if impl == rt.FUSED_NAME:
        _needs_triton()
    model = _model("qwen3_moe")
    ids = torch.randint(3, _COMMON["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(4))
    eager_logits, eager_loss, eager_grads = _step(model, impl, ids)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    model.zero_grad(set_to_none=True)
    out = compiled(ids, labels=ids)
    out.loss.backward()
    torch.testing.assert_close(out.logits.detach(), eager_logits, **TOL)
    torch.testing.assert_close(out.loss.detach(), eager_loss, **TOL)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, eager_grads[name], **TOL, msg=name)
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------- registration, errors
def test_register_is_idempotent_and_visible_to_models():
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert rt.register() == "ragdot"
    fn = ALL_EXPERTS_FUNCTIONS["ragdot"]
    assert rt.register() == "ragdot"
    assert ALL_EXPERTS_FUNCTIONS["ragdot"] is fn
    assert rt.is_registered()
    assert rt.make_experts_forward(None) is fn
    model = _model("olmoe")
    model.set_experts_implementation("ragdot")
    assert model.config._experts_implementation == "ragdot"


def test_register_under_another_name_with_a_backend():
    assert rt.register("ragdot_reference", backend="reference") == "ragdot_reference"
    assert rt.is_registered("ragdot_reference")
    module = _experts("mixtral")
    idx, w = _routing(8, 2, module.num_experts, seed=9)
    x = torch.randn(8, _hidden(module))
    outs = {}
    for impl in ("ragdot_reference", "grouped_mm"):
        module.config._experts_implementation = impl
        with torch.no_grad():
            outs[impl] = module(x, idx, w)
    torch.testing.assert_close(outs["ragdot_reference"], outs["grouped_mm"], **TOL)


@pytest.mark.parametrize("name", ["grouped_mm", "eager", ""])
def test_register_refuses_names_it_does_not_own(name):
    with pytest.raises(ValueError, match="name"):
        rt.register(name)


def test_interleaved_gate_up_without_its_own_gate_is_refused():
    module = _experts("qwen3_moe")
    module.is_concatenated = False
    module.config._experts_implementation = "ragdot"
    idx, w = _routing(4, 2, module.num_experts, seed=10)
    with pytest.raises(ValueError, match="is_concatenated=False"):
        module(torch.randn(4, _hidden(module)), idx, w)


def test_missing_post_expert_norm_is_refused():
    module = _experts("qwen3_moe")
    module.has_post_expert_norm = True
    module.config._experts_implementation = "ragdot"
    idx, w = _routing(4, 2, module.num_experts, seed=11)
    with pytest.raises(ValueError, match="has_post_expert_norm=True"):
        module(torch.randn(4, _hidden(module)), idx, w)


def test_register_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="backend='nope'"):
        rt.register("ragdot_nope", backend="nope")


def test_missing_bias_is_refused():
    module = _experts("qwen3_moe")
    module.has_bias = True
    module.config._experts_implementation = "ragdot"
    idx, w = _routing(4, 2, module.num_experts, seed=13)
    with pytest.raises(ValueError, match="has_bias=True needs .*gate_up_proj_bias"):
        module(torch.randn(4, _hidden(module)), idx, w)


# ------------------------------------------------------------------------------------------------- GPU
def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "deepseek_v3"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
@pytest.mark.parametrize("impl", ["ragdot", "ragdot_fused"])
def test_bfloat16_on_cuda_matches_grouped_mm(family, compiled, impl):
    """bfloat16 on the GPU (ragdot's own kernels): logits, loss and gradients within bfloat16 tolerance.

    One MoE layer, so that rounding differences cannot flip a later layer's top-k choice."""
    extra = dict(first_k_dense_replace=0) if family == "deepseek_v3" else {}
    model = _model(family, num_hidden_layers=1, **extra).to("cuda", torch.bfloat16)
    ids = torch.randint(3, _COMMON["vocab_size"], (4, 64), generator=torch.Generator().manual_seed(12)).cuda()
    results = {}
    for name in (impl, "grouped_mm"):
        torch._dynamo.reset()
        model.set_experts_implementation(name)
        run = torch.compile(model) if compiled else model
        model.zero_grad(set_to_none=True)
        out = run(ids, labels=ids)
        out.loss.backward()
        results[name] = (out.logits.detach(), out.loss.detach(), {n: p.grad for n, p in model.named_parameters()})
    torch._dynamo.reset()
    (logits, loss, grads), (o_logits, o_loss, o_grads) = results[impl], results["grouped_mm"]
    assert _rel_err(logits, o_logits) < 2e-2
    assert abs(float(loss) - float(o_loss)) < 2e-2
    for name, g in grads.items():
        assert g is not None and o_grads[name] is not None, name
        assert _rel_err(g, o_grads[name]) < 5e-2, name


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["ragdot", "ragdot_fused"])
@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_experts_forward_and_backward_never_wait_for_the_device(impl, family):
    """No host synchronisation in a warm experts forward + backward (CUDA's sync debug mode raises on one)."""
    module = _experts(family).to("cuda", torch.bfloat16)
    module.config._experts_implementation = impl
    idx, w = _routing(64, 2, module.num_experts, seed=17)
    idx, w = idx.cuda(), w.to("cuda", torch.bfloat16)
    x = torch.randn(64, _hidden(module), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    module(x, idx, w).float().sum().backward()  # warm-up: kernel compilation and configuration look-ups
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        module(x, idx, w).float().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
