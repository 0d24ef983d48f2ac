"""Bytes that autograd keeps for the backward of one MoE experts block, per implementation (CPU, seconds).

    PYTHONPATH=src TRITON_INTERPRET=1 python3 benchmarks/saved_bytes.py [--out DIR] [--dtype bfloat16] [--totals]
    PYTHONPATH=src python3 benchmarks/saved_bytes.py --device cuda --out DIR [--snapshot]    # one GPU, ~1 min

Memory is deterministic: what a forward leaves saved for its backward is the same on a CPU as on a GPU for
the same shapes, so this runs on the CPU (the fused kernels through Triton's interpreter, TRITON_INTERPRET=1).
Every tensor a forward saves passes through ``torch.autograd.graph.saved_tensors_hooks``; each storage is
counted once (views share their storage), and split into

- ``params``: storages of the module's parameters (kept by the model anyway, no extra memory);
- ``inputs``: storages of the block's inputs (hidden states, routing weights: the previous layers' outputs);
- ``new``: storages the block allocated itself: the activation memory the block adds until its backward.

Each new storage is listed with its shape, dtype and the autograd nodes that saved it (found by walking the
graph from the output). Cases:

- transformers' experts of a tiny Qwen3-MoE-like block, gpt-oss-like (biases, transposed weights, its clamped
  gate) and DeepSeek-V3-like, for "grouped_mm", "ragdot" and "ragdot_fused" (skipped without transformers);
- a whole tiny Qwen3-MoE model per implementation (embedding to loss);
- ``ragdot.moe.MoELayer(path="sparse")`` (fused=False and fused=True) against ``ragdot.moe.peer.peer_moe``,
  router included.

Beside the saved bytes, one forward and backward per case gives ``step_memory``: the bytes AccumulateGrad
allocates (copies of gradients that come in another layout than their parameter's) and the step's peak of CPU
allocations (indicative only: the CPU kernels' temporaries are not the GPU's). ``--device cuda`` runs one
experts block per ``ragdot bench-models`` model at its real widths (bf16, 8192 tokens) and reports the saved
bytes and the CUDA allocator's peak over the step (``--snapshot``: a ``torch.cuda.memory`` snapshot per row,
for https://pytorch.org/memory_viz). With ``--out``, rows go to ``saved-bytes-<date>.csv/.json`` there (one row
per case with the totals, and on the CPU one per new storage).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

if __name__ == "__main__" and "cuda" not in " ".join(sys.argv[1:]):
    # a CPU run: the fused kernels through Triton's interpreter, chosen before triton is imported (imported as
    # a module, as the tests do, the process's own setting stays: a GPU test session must not be switched)
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Shapes: tokens, hidden, expert width, experts, top-k (small: the fused kernels run in Triton's interpreter).
TOKENS, DIM, HIDDEN, EXPERTS, TOP_K = 64, 32, 16, 8, 2


@dataclass
class Saved:
    """The storages one forward saved: key -> (bytes, shape, dtype, kind, nodes)."""

    entries: dict[tuple, dict] = field(default_factory=dict)
    step: dict[str, int] = field(default_factory=dict)  # step_memory of a forward and backward, where measured

    def total(self, kind: str | None = None) -> int:
        return sum(e["bytes"] for e in self.entries.values() if kind is None or e["kind"] == kind)

    def new(self) -> list[dict]:
        return sorted((e for e in self.entries.values() if e["kind"] == "new"), key=lambda e: -e["bytes"])


def _key(t: torch.Tensor) -> tuple:
    s = t.untyped_storage()
    return (t.device.type, s.data_ptr(), s.nbytes())


def measure_saved(fn: Callable[[], torch.Tensor], params: list[torch.Tensor], inputs: list[torch.Tensor]) -> Saved:
    """Run ``fn`` (a forward) under saved-tensor hooks; the storages autograd saved, each counted once.
    The output is kept alive until the graph walk so that nothing saved is freed in between."""
    param_keys = {_key(p) for p in params}
    input_keys = {_key(t) for t in inputs}
    saved = Saved()

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _key(t)
        if key not in saved.entries:
            kind = "params" if key in param_keys else "inputs" if key in input_keys else "new"
            saved.entries[key] = dict(bytes=key[2], shape=tuple(t.shape), dtype=str(t.dtype).replace("torch.", ""),
                                      kind=kind, nodes=set())  # fmt: skip
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    _attribute(out, saved)
    del out
    return saved


def _attribute(out: torch.Tensor, saved: Saved) -> None:
    """Name the autograd nodes that hold each saved storage (C++ nodes' ``_saved_*`` fields, Python nodes'
    ``saved_tensors``)."""
    seen, stack = set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for t in _node_tensors(node):
            entry = saved.entries.get(_key(t))
            if entry is not None:
                entry["nodes"].add(type(node).__name__)
        stack.extend(n for n, _ in node.next_functions)


def _node_tensors(node) -> list[torch.Tensor]:
    found = []
    for name in dir(node):
        if name.startswith("_saved_"):
            try:
                value = getattr(node, name)
            except RuntimeError:
                continue
            values = value if isinstance(value, (tuple, list)) else (value,)
            found += [v for v in values if isinstance(v, torch.Tensor)]
    with contextlib.suppress(RuntimeError):  # a node whose saved tensors were freed already
        found += [t for t in getattr(node, "saved_tensors", ()) or () if isinstance(t, torch.Tensor)]
    return found


def step_memory(step: Callable[[], None]) -> dict[str, int]:
    """CPU allocations of one ``step`` (a forward and backward), from torch.profiler's memory events:
    ``peak``, the most bytes allocated during the step and alive at once (on top of what lived before it);
    ``grad_copies``, the bytes allocated inside AccumulateGrad nodes (a gradient that does not come in its
    parameter's layout is copied there, so both live at once). The CPU kernels' temporaries are not the GPU's
    (CPU ``torch._grouped_mm`` loops over experts; ragdot's routing takes its torch fallback on a CPU), so
    ``peak`` is only indicative; ``grad_copies`` does not depend on the device."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = list(prof.profiler.kineto_results.events())
    memory = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    accumulate = [(e.start_ns(), e.end_ns()) for e in events if e.name() == "torch::autograd::AccumulateGrad"]
    live = peak = copies = 0
    for e in memory:
        live += e.nbytes()
        peak = max(peak, live)
        if e.nbytes() > 0 and any(a <= e.start_ns() <= b for a, b in accumulate):
            copies += e.nbytes()
    return dict(peak=peak, grad_copies=copies)


def _step_of(fn: Callable[[], torch.Tensor], leaves: list[torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        for t in leaves:
            t.grad = None
        y = fn()
        y.backward(torch.ones_like(y))

    return step


# ------------------------------------------------------------------------------------------------ cases
def _routing(tokens: int, experts: int, top_k: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=gen)
    weights, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return ids, (weights / weights.sum(-1, keepdim=True)).to(dtype)


HF_FAMILIES = {  # name -> (config class, causal-LM class, config values of a tiny model)
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(intermediate_size=48, moe_intermediate_size=HIDDEN, num_experts=EXPERTS,
                       num_experts_per_tok=TOP_K, head_dim=8)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(intermediate_size=HIDDEN, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, head_dim=8,
                     sliding_window=8)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=HIDDEN,
                         n_routed_experts=EXPERTS, num_experts_per_tok=TOP_K, n_shared_experts=1,
                         first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=16, kv_lora_rank=16,
                         qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)),
}  # fmt: skip
HF_COMMON = dict(vocab_size=96, hidden_size=DIM, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
HF_IMPLS = ("grouped_mm", "ragdot", "ragdot_fused")


def hf_model(family: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """A tiny random transformers model of ``family`` with ragdot's experts implementations registered."""
    import transformers

    import ragdot.integrations.transformers as rt

    rt.register()
    rt.register(rt.FUSED_NAME, fused=True)
    config_name, model_name, values = HF_FAMILIES[family]
    config = getattr(transformers, config_name)(**{**HF_COMMON, **values})
    torch.manual_seed(seed)
    return getattr(transformers, model_name)(config).to(dtype)


def experts_module(model: torch.nn.Module) -> torch.nn.Module:
    """The first decorated experts module of a transformers model."""
    for module in model.modules():
        weights = hasattr(module, "gate_up_proj") or hasattr(module, "up_proj")
        if weights and hasattr(module, "down_proj") and isinstance(getattr(module, "num_experts", None), int):
            return module
    raise ValueError("the model has no experts module")


def hf_experts_saved(family: str, impl: str, dtype: torch.dtype = torch.float32, tokens: int = TOKENS) -> Saved:
    """Saved storages of one experts block of a tiny ``family`` model run by ``impl``."""
    model = hf_model(family, dtype)
    model.set_experts_implementation(impl)
    experts = experts_module(model)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, DIM, generator=gen).to(dtype).requires_grad_()
    ids, weights = _routing(tokens, experts.num_experts, TOP_K, dtype)
    weights.requires_grad_()
    params = list(experts.parameters())
    saved = measure_saved(lambda: experts(x, ids, weights), params, [x, weights])
    step = _step_of(lambda: experts(x, ids, weights), [*params, x, weights])
    step()  # warm: first-call caches and lazily built state are not the step's memory
    saved.step = step_memory(step)
    return saved


def hf_model_saved(family: str, impl: str, dtype: torch.dtype = torch.float32) -> Saved:
    """Saved storages of a whole tiny model's forward and loss (batch 2 x 16 tokens)."""
    model = hf_model(family, dtype)
    model.set_experts_implementation(impl)
    ids = torch.randint(3, HF_COMMON["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))
    saved = measure_saved(lambda: model(ids, labels=ids).loss, list(model.parameters()), [])
    step = _step_of(lambda: model(ids, labels=ids).loss, list(model.parameters()))
    step()
    saved.step = step_memory(step)
    return saved


LAYER_VARIANTS = ("peer", "sparse", "sparse_fused")


def layer_saved(variant: str, dtype: torch.dtype = torch.float32, tokens: int = TOKENS) -> Saved:
    """Saved storages of ``MoELayer(path="sparse")`` (``sparse_fused``: fused=True) or of ``peer_moe`` on the
    same parameters, router included; backend ``torch`` for ragged_dot (the CPU's)."""
    from ragdot.moe import MoELayer
    from ragdot.moe.peer import peer_moe

    torch.manual_seed(0)
    layer = MoELayer(DIM, HIDDEN, EXPERTS, TOP_K, path="sparse", backend="torch", dtype=dtype,
                     fused=variant == "sparse_fused")
    x = torch.randn(tokens, DIM, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_()
    if variant == "peer":
        def fn() -> torch.Tensor:
            return peer_moe(x, layer.router.weight, layer.w_gate_up, layer.w_down, layer.top_k)
    else:
        def fn() -> torch.Tensor:
            return layer(x)
    saved = measure_saved(fn, list(layer.parameters()), [x])
    step = _step_of(fn, [*layer.parameters(), x])
    step()
    saved.step = step_memory(step)
    return saved


# ------------------------------------------------------------------------------------------------ GPU
GPU_TOKENS = 8192  # bench-models' train step: 4 x 2048 tokens


def gpu_experts(model_name: str, device: torch.device) -> torch.nn.Module:
    """One experts module of a ``ragdot bench-models`` model at its real widths, bf16 on ``device``, random init:
    the model is built on the meta device to find its experts class, which is then built alone."""
    import transformers

    from ragdot.bench.models import MODELS

    spec = MODELS[model_name]
    config = getattr(transformers, spec.config_class)(**{**spec.config, "num_hidden_layers": 1, "vocab_size": 256})
    with torch.device("meta"):
        meta = getattr(transformers, spec.model_class)(config)
    cls = type(experts_module(meta))
    torch.manual_seed(0)
    with torch.device(device):
        experts = cls(config).to(torch.bfloat16)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0.0, 0.02)
    return experts


def gpu_rows(device: torch.device, snapshot_dir: Path | None) -> list[dict]:
    """Per bench-models model and implementation, one experts block's forward and backward at 8192 tokens:
    the new bytes saved for the backward, and the peak of ``torch.cuda.max_memory_allocated`` over the step
    above what was allocated before it (the weight gradients included, the same for every implementation)."""
    import ragdot.integrations.transformers as rt

    rt.register()
    rt.register(rt.FUSED_NAME, fused=True)
    rows: list[dict] = []
    for model_name in ("qwen3-moe", "gpt-oss", "deepseek-v3"):
        rows += _gpu_model_rows(model_name, device, snapshot_dir)
        torch.cuda.empty_cache()
    return rows


def _gpu_model_rows(model_name: str, device: torch.device, snapshot_dir: Path | None) -> list[dict]:
    experts = gpu_experts(model_name, device)
    dim = experts.gate_up_proj.shape[1 if experts.is_transposed else 2]
    top_k = 4 if model_name == "gpt-oss" else 8
    x = torch.randn(GPU_TOKENS, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    ids, weights = _routing(GPU_TOKENS, experts.num_experts, top_k, torch.bfloat16)
    ids, weights = ids.to(device), weights.to(device).requires_grad_()

    def fn() -> torch.Tensor:
        return experts(x, ids, weights)

    rows = []
    for impl in HF_IMPLS:
        experts.config._experts_implementation = impl
        saved = measure_saved(fn, list(experts.parameters()), [x, weights])
        step = _step_of(fn, [*experts.parameters(), x, weights])
        step()  # warm
        snapshot = None if snapshot_dir is None else snapshot_dir / f"memory-{model_name}-{impl}.pickle"
        peak = _cuda_step_peak(step, device, snapshot)
        row = _rows(f"{model_name}_experts_gpu", impl, saved)[0]
        row.update(step_peak=peak, grad_copies=None)
        rows.append(row)
        print(f"{model_name:<12} {impl:<13} saved new {row['new'] / 2**20:9.1f} MiB  "
              f"step peak {peak / 2**20:9.1f} MiB")  # fmt: skip
    return rows


def _cuda_step_peak(step: Callable[[], None], device: torch.device, snapshot: Path | None) -> int:
    torch.cuda.synchronize(device)
    if snapshot is not None:
        torch.cuda.memory._record_memory_history(max_entries=200000)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    if snapshot is not None:
        torch.cuda.memory._dump_snapshot(str(snapshot))
        torch.cuda.memory._record_memory_history(enabled=None)
    return peak


# ------------------------------------------------------------------------------------------------ report
def _rows(case: str, impl: str, saved: Saved) -> list[dict]:
    rows = [dict(case=case, impl=impl, what="total", bytes=saved.total(), new=saved.total("new"),
                 inputs=saved.total("inputs"), params=saved.total("params"), step_peak=saved.step.get("peak"),
                 grad_copies=saved.step.get("grad_copies"))]  # fmt: skip
    for e in saved.new():
        rows.append(dict(case=case, impl=impl, what="storage", bytes=e["bytes"], shape="x".join(map(str, e["shape"])),
                         dtype=e["dtype"], nodes=" ".join(sorted(e["nodes"]))))  # fmt: skip
    return rows


def collect(dtype: torch.dtype, whole_models: bool = True) -> list[dict]:
    rows: list[dict] = []
    for variant in LAYER_VARIANTS:
        rows += _rows("moe_layer", variant, layer_saved(variant, dtype))
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed: its cases are skipped", file=sys.stderr)
        return rows
    for family in HF_FAMILIES:
        for impl in HF_IMPLS:
            rows += _rows(f"{family}_experts", impl, hf_experts_saved(family, impl, dtype))
    if whole_models:
        for impl in HF_IMPLS:
            rows += _rows("qwen3_moe_model", impl, hf_model_saved("qwen3_moe", impl, dtype))
    return rows


def print_rows(rows: list[dict]) -> None:
    base: dict[str, int] = {}
    for r in rows:
        if r["what"] == "total":
            base.setdefault(r["case"], r["new"])
            ratio = r["new"] / base[r["case"]] if base[r["case"]] else float("nan")
            peak, copies = r["step_peak"], r["grad_copies"]
            step = "" if peak is None else f"  step peak {peak:>7} B  copies {copies:>6} B"
            print(f"{r['case']:<20} {r['impl']:<13} new {r['new']:>7} B ({ratio:4.2f}x of the first)"
                  f"  inputs {r['inputs']:>5} B  params {r['params']:>6} B{step}")  # fmt: skip
        else:
            print(f"{'':<20} {'':<13}   {r['bytes']:>9} B  {r['shape']:<10} {r['dtype']:<9} {r['nodes']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write saved-bytes-<date>.csv/.json here")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--no-models", action="store_true", help="skip the whole-model cases")
    parser.add_argument("--totals", action="store_true", help="print the totals only, not every new storage")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: the bench-models widths at 8192 tokens, bf16, with the CUDA allocator's peak")
    parser.add_argument("--snapshot", action="store_true", help="cuda: a memory snapshot per row under --out")
    args = parser.parse_args(argv)
    dtype = torch.bfloat16 if args.device == "cuda" else getattr(torch, args.dtype)
    if args.device == "cuda":
        snapshots = args.out if args.snapshot and args.out is not None else None
        if snapshots is not None:
            snapshots.mkdir(parents=True, exist_ok=True)
        rows = gpu_rows(torch.device("cuda"), snapshots)
    else:
        from ragdot.kernels import interpreter

        # sizes only: no value a kernel computes is read, so a dtype the interpreter multiplies wrong may run
        interpreter.refuse_wrong_dots = False
        rows = collect(dtype, whole_models=not args.no_models)
        print_rows([r for r in rows if r["what"] == "total"] if args.totals else rows)
    if args.out is not None:
        from ragdot.measure.records import new_stem, run_meta, write_csv, write_json

        args.out.mkdir(parents=True, exist_ok=True)
        stem = new_stem(args.out, "saved-bytes")
        meta = run_meta(args.device, dtype)
        meta["shapes"] = (dict(tokens=GPU_TOKENS, models="bench-models widths") if args.device == "cuda" else
                          dict(tokens=TOKENS, dim=DIM, hidden=HIDDEN, experts=EXPERTS, top_k=TOP_K))
        columns = ["case", "impl", "what", "bytes", "new", "inputs", "params", "step_peak", "grad_copies", "shape",
                   "dtype", "nodes"]
        write_csv(rows, args.out / f"{stem}.csv", columns)
        write_json(args.out / f"{stem}.json", meta, rows, columns)
        print(f"wrote {args.out / stem}.csv/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
