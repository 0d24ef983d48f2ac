"""`ragdot bench-models`: whole-model steps of small random-init Hugging Face transformers MoE models.

    ragdot bench-models --out results/models                 # every model, impl, mode and phase (GPU)
    ragdot bench-models --models qwen3-moe --modes eager --phases train
    ragdot bench-models --tiny                               # CPU smoke run of a tiny config, seconds
    ragdot bench-models --modes eager --phases train --profile   # where the kernel time goes, per row

Per (mode, model, phase, batch) every experts implementation runs in turn on the same model (switched with
``set_experts_implementation``): transformers' own "grouped_mm", "batched_mm" and "eager", ragdot's "ragdot"
(``ragdot.moe.fused`` in eager training where it applies and is preferred, the ragged_dot path elsewhere),
"ragdot_fused" (the fused block wherever the layout is plain SwiGLU) and on request "ragdot_unfused" (the
ragged_dot path only) and "ragdot_triton" / "ragdot_torch" (ragged_dot's backend pinned). Phases:
``train`` (forward + loss + backward of ``batch x seq_len`` tokens), ``prefill`` (a no-grad forward of
``batch x prefill_len`` tokens filling a KV cache, logits of the last position only) and ``decode`` (one new
token per sequence on a cache of ``prefill_len`` tokens, batch 1, 8 and 64 by default). Modes: ``eager`` and
``compile`` (``torch.compile`` of the whole model, ``--compile-backend``, default inductor).

Clock: CUDA events around each eager Python call of a step (a compiled model is called the same way; no CUDA
graphs), the median over ``--steps`` steps after ``--warmup`` ones; the wall clock on a CPU. In eager mode the
implementations of one (model, phase, batch) are timed interleaved (rows say ``timing: interleaved``): after
each one's warm-up, rounds visit every implementation in turn (the first rotating), each visit switching the
model to it, running one untimed step (decode: a fresh prompt's prefill, then one step), then timing
``STEPS_PER_VISIT`` steps (decode: ``DECODE_STEPS_PER_VISIT``). Decode and small prefill steps are host-bound,
and the host's speed drifts by 10-50% over minutes, so timing implementations one after the other compares
hosts as much as code; ``--sequential`` times them one after the other instead. Compiled rows are interleaved
the same way: one ``torch.compile`` of the model per (model, phase, batch), whose graphs for every
implementation stay in dynamo's cache (each visit's untimed step runs the graph of the implementation switched
to; a row whose timed steps still compiled a graph says so in ``note``). Peak memory:
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` at the start of the timed steps (weights,
gradients and cache included). A run that does not fit is a row with status OOM; items that the ``--budget``
leaves out are rows with status "budget". Writes bench-models-<gpu>-<date>.csv and .json under --out, rows as
they finish, and prints a table with each ragdot implementation's time and peak memory relative to
"grouped_mm" (``x`` > 1: faster than grouped_mm).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import itertools
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ragdot.cli_common import (
    UsageError,
    add_device,
    add_dtype,
    add_out,
    add_quiet,
    check_out,
    count,
    parse_device,
    parse_dtype,
    safe_name,
    seconds,
)
from ragdot.measure import records

HELP = "whole-model train, prefill and decode steps of transformers MoE models per experts implementation"

IMPLS: tuple[str, ...] = ("grouped_mm", "ragdot", "ragdot_fused", "batched_mm", "eager")
# ragdot registered with other arguments, on request: ragged_dot's backend pinned (then never the fused block), or
# the unfused path only (the default "ragdot" takes the fused block in eager training where it is preferred)
EXTRA: dict[str, dict] = {"ragdot_triton": {"backend": "triton"}, "ragdot_torch": {"backend": "torch"},
                          "ragdot_unfused": {"fused": False}}
MODES: tuple[str, ...] = ("eager", "compile")
PHASES: tuple[str, ...] = ("train", "prefill", "decode")
RAGDOT_IMPLS: tuple[str, ...] = ("ragdot", "ragdot_fused", *EXTRA)
# The step with no expert work at all (see ``_no_experts``): grouped_mm's ms over its ms is the most any experts
# implementation could gain on that step; rows get it as ``bound_vs_grouped_mm``
NO_EXPERTS = "no_experts"
CLOCK_CUDA = "CUDA events around each eager call, median"
CLOCK_CPU = "wall clock around each call, median"
STEPS_PER_VISIT = 2  # timed train or prefill steps per visit of an implementation (interleaved timing)
DECODE_STEPS_PER_VISIT = 4  # timed decode steps per visit


@dataclass(frozen=True)
class ModelSpec:
    """One model: transformers config / causal-LM class names, config values, and what is reduced and why."""

    name: str
    config_class: str
    model_class: str
    config: dict[str, Any]
    note: str = ""
    seq_len: int = 2048
    train_batch: int = 4
    prefill_len: int = 512
    extra: dict[str, Any] = field(default_factory=dict)


_VOCAB = 32768  # all models: a 32k vocabulary, so that the step time is the decoder's, not the LM head's

MODELS: dict[str, ModelSpec] = {
    "qwen3-moe": ModelSpec(
        "qwen3-moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
        dict(hidden_size=2048, moe_intermediate_size=768, intermediate_size=6144, num_experts=128,
             num_experts_per_tok=8, num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=4,
             head_dim=128, norm_topk_prob=True),
        "Qwen3-30B-A3B widths, 4 layers, 32k vocabulary",
    ),
    "gpt-oss": ModelSpec(
        "gpt-oss", "GptOssConfig", "GptOssForCausalLM",
        dict(hidden_size=2880, intermediate_size=2880, num_local_experts=128, num_experts_per_tok=4,
             num_hidden_layers=4, num_attention_heads=64, num_key_value_heads=8, head_dim=64, sliding_window=128),
        "gpt-oss-120b widths (expert biases, its clamped gate), 4 layers, 32k vocabulary",
    ),
    "deepseek-v3": ModelSpec(
        "deepseek-v3", "DeepseekV3Config", "DeepseekV3ForCausalLM",
        dict(hidden_size=7168, moe_intermediate_size=2048, intermediate_size=18432, n_routed_experts=64,
             num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=0, n_group=8, topk_group=4,
             num_hidden_layers=4, num_attention_heads=64, num_key_value_heads=64, q_lora_rank=1536,
             kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128),
        "DeepSeek-V3 hidden 7168 and expert width 2048, reduced to 64 routed experts (256) and 64 heads (128) so "
        "that 4 MoE layers with their gradients fit one 141 GB GPU; 32k vocabulary",
    ),
}

_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=96)
TINY_MODELS: dict[str, ModelSpec] = {
    "qwen3-moe": replace(MODELS["qwen3-moe"], config={
        **MODELS["qwen3-moe"].config, **_TINY, "moe_intermediate_size": 16, "intermediate_size": 48,
        "num_experts": 8, "num_experts_per_tok": 2, "head_dim": 8}),
    "gpt-oss": replace(MODELS["gpt-oss"], config={
        **MODELS["gpt-oss"].config, **_TINY, "intermediate_size": 24, "num_local_experts": 6,
        "num_experts_per_tok": 2, "head_dim": 8, "sliding_window": 8}),
    "deepseek-v3": replace(MODELS["deepseek-v3"], config={
        **MODELS["deepseek-v3"].config, **_TINY, "num_key_value_heads": 4, "intermediate_size": 48,
        "moe_intermediate_size": 16, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2,
        "topk_group": 1, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
        "v_head_dim": 8}),
}  # tiny CPU smoke versions of each family (--tiny), same names
for _name, _spec in TINY_MODELS.items():
    TINY_MODELS[_name] = replace(_spec, note="tiny CPU smoke config", seq_len=16, train_batch=2, prefill_len=8)


# ------------------------------------------------------------------------------------------------ arguments
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", choices=list(MODELS), metavar="MODEL",
                        help=f"models (default all: {' '.join(MODELS)})")
    parser.add_argument("--impls", nargs="+", choices=[*IMPLS, *EXTRA, NO_EXPERTS], metavar="IMPL",
                        help=f"experts implementations (default: {' '.join(IMPLS)}; also {' '.join(EXTRA)}: "
                        "ragdot with ragged_dot's backend pinned instead of auto, or without the fused block; "
                        f"{NO_EXPERTS}: the step without any expert work, the bound of what an experts "
                        "implementation can gain)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), metavar="MODE", help="eager, compile (default both)")
    parser.add_argument("--phases", nargs="+", choices=list(PHASES), metavar="PHASE",
                        help="train, prefill, decode (default all)")
    parser.add_argument("--decode-batches", nargs="+", type=count(1), metavar="B",
                        help="batch sizes of prefill and decode (default 1 8 64; --tiny: 1 2)")
    parser.add_argument("--layers", type=count(1), help="override the models' layer count")
    parser.add_argument("--seq-len", type=count(1), help="override the train sequence length (default 2048)")
    parser.add_argument("--train-batch", type=count(1), help="override the train batch (default 4: 8192 tokens)")
    parser.add_argument("--prefill-len", type=count(1), help="override the prompt length of prefill/decode (512)")
    parser.add_argument("--steps", type=count(1), default=5, help="timed steps per row (default 5; decode: 4x)")
    parser.add_argument("--warmup", type=count(0), default=2, help="untimed steps first (default 2; decode: 2x)")
    parser.add_argument("--eager-impl-phases", nargs="+", choices=list(PHASES), default=["train"],
                        metavar="PHASE", help="phases the slow 'eager' loop runs in, eager mode only (default train)")
    parser.add_argument("--profile", action="store_true",
                        help="profile one more step per row: kernel time and the top kernels (CPU: top ops)")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--sequential", action="store_true",
                        help="time the implementations one after the other, not interleaved")
    parser.add_argument(
        "--budget", type=seconds, default=0.0, metavar="SECONDS",
        help="time budget of the whole run: once spent, the remaining rows are written with status 'budget'",
    )  # fmt: skip
    parser.add_argument(
        "--tiny", action="store_true",
        help="tiny versions of the models (default qwen3-moe only; impls grouped_mm ragdot eager; eager mode; "
        "batches 1 2) on the CPU, 2 steps: a smoke run in seconds",
    )  # fmt: skip
    add_dtype(parser, "bf16 on CUDA, fp32 on a CPU")
    parser.add_argument(
        "--autocast", metavar="DTYPE",
        help="run every forward inside torch.autocast(dtype=DTYPE), the backward outside it, as a mixed-precision "
        "trainer does (bf16 or fp16; with --dtype fp32: float32 parameters, 16-bit compute)",
    )  # fmt: skip
    add_device(parser, "cuda if available, else cpu; cpu with --tiny")
    add_out(parser, "out/bench-models", "CSV and JSON")
    add_quiet(parser)


# ------------------------------------------------------------------------------------------------ work items
@dataclass(frozen=True)
class Item:
    mode: str
    model: ModelSpec
    phase: str
    batch: int
    impl: str

    def tokens(self) -> int:
        if self.phase == "train":
            return self.batch * self.model.seq_len
        return self.batch * (self.model.prefill_len if self.phase == "prefill" else 1)

    def key(self) -> dict[str, Any]:
        return dict(model=self.model.name, impl=self.impl, mode=self.mode, phase=self.phase, batch=self.batch,
                    tokens=self.tokens())


def plan(models: list[ModelSpec], args: argparse.Namespace) -> list[Item]:
    """Rows in run order, the impls of one (model, phase, batch) together: the train steps first (eager, then
    compiled, model by model), then prefill and decode (eager, then compiled), so that a budget spent early
    still leaves the train comparison of every model in both modes."""
    items = []
    train = [p for p in args.phases if p == "train"]
    inference = [p for p in args.phases if p != "train"]
    for phases, mode in [(train, m) for m in args.modes] + [(inference, m) for m in args.modes]:
        for spec in models:
            for phase in phases:
                batches = [spec.train_batch] if phase == "train" else args.decode_batches
                for batch in batches:
                    for impl in args.impls:
                        if impl == "eager" and (mode != "eager" or phase not in args.eager_impl_phases):
                            continue
                        items.append(Item(mode, spec, phase, batch, impl))
    return items


# ------------------------------------------------------------------------------------------------ models
def build_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    import transformers

    config_cls, model_cls = getattr(transformers, spec.config_class), getattr(transformers, spec.model_class)
    values = dict(vocab_size=_VOCAB, max_position_embeddings=8192, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = config_cls(**{**values, **spec.config})
    previous = torch.get_default_dtype()
    torch.manual_seed(0)
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device):
            model = model_cls(config)
    finally:
        torch.set_default_dtype(previous)
    return model.to(device=device, dtype=dtype)


def _ids(spec: ModelSpec, batch: int, length: int, device: torch.device) -> torch.Tensor:
    vocab = spec.config.get("vocab_size", _VOCAB)
    gen = torch.Generator(device="cpu").manual_seed(batch * 1009 + length)
    return torch.randint(3, vocab, (batch, length), generator=gen).to(device)


def _step_fn(item: Item, model: torch.nn.Module, run: Callable, device: torch.device) -> Iterator[Callable[[], Any]]:
    """Yields the step callable of each timed or warm-up step (decode: each on the cache the last one left)."""
    spec = item.model
    if item.phase == "train":
        ids = _ids(spec, item.batch, spec.seq_len, device)

        def train() -> None:
            model.zero_grad(set_to_none=True)
            run(ids, labels=ids).loss.backward()

        while True:
            yield train
    prompt = _ids(spec, item.batch, spec.prefill_len, device)
    if item.phase == "prefill":
        def prefill() -> None:
            with torch.no_grad():
                run(prompt, use_cache=True, logits_to_keep=1)

        while True:
            yield prefill
    name = _cache_argument(model)
    while True:  # decode: a fresh cache of the prompt, then one token per step on it
        with torch.no_grad():  # the prompt eagerly: a compiled decode row then compiles no prefill graph
            out = model(prompt, use_cache=True, logits_to_keep=1)
        state = {"cache": _cache_of(out), "next": out.logits[:, -1:].argmax(-1)}
        for _ in range(4 * 8):

            def decode(state: dict = state) -> None:
                with torch.no_grad():
                    o = run(state["next"], use_cache=True, **{name: state["cache"]})
                state["cache"], state["next"] = _cache_of(o), o.logits[:, -1:].argmax(-1)

            yield decode


def _cache_argument(model: torch.nn.Module) -> str:
    """The forward's KV-cache argument: ``cache`` in newer transformers (5.24), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _prepare(item: Item, model: torch.nn.Module, args: argparse.Namespace, compiled: list | None = None) -> Callable:
    """Switch the model to the item's implementation and train/eval mode; returns what runs a step. Compiled:
    a fresh dynamo cache and compile, or, given `compiled` (the interleaved group's), its one compile of the
    model, made on the group's first call (the implementations' graphs then share dynamo's cache)."""
    model.set_experts_implementation(item.impl)
    model.train(item.phase == "train")
    if item.mode != "compile":
        return _in_autocast(model, args.autocast)
    if compiled:
        return _in_autocast(compiled[0], args.autocast)
    torch._dynamo.reset()
    run = torch.compile(model, backend=args.compile_backend)
    if compiled is not None:
        compiled.append(run)
    return _in_autocast(run, args.autocast)


def _in_autocast(run: Callable, dtype: torch.dtype | None) -> Callable:
    """`run` called inside torch.autocast(dtype) on its device (the backward of a train step stays outside)."""
    if dtype is None:
        return run

    def forward(ids: torch.Tensor, **kwargs: Any) -> Any:
        with torch.autocast(ids.device.type, dtype=dtype):
            return run(ids, **kwargs)

    return forward


def _graphs() -> int:
    """Graphs dynamo has compiled in this process (to tell whether a timed step compiled one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _counts(item: Item, args: argparse.Namespace) -> tuple[int, int]:
    """(warm-up steps, timed steps) of the item: decode steps are short, so four times as many."""
    scale = 4 if item.phase == "decode" else 1
    return scale * args.warmup, scale * args.steps


def _row(item: Item, times: list[float], peak: float | None, timing: str) -> dict:
    ms = statistics.median(times)
    return dict(ms=ms, tokens_per_s=item.tokens() / (ms / 1e3), peak_gib=peak, steps=len(times), timing=timing)


def _peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    from ragdot.measure.timing import synchronize

    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def measure_item(item: Item, model: torch.nn.Module, device: torch.device, args: argparse.Namespace) -> dict:
    """The row of one item timed on its own: warm-up, then the timed steps."""
    from ragdot.measure.timing import timed_call

    run = _prepare(item, model, args)
    warmup, steps = _counts(item, args)
    fns = _step_fn(item, model, run, device)
    for _ in range(warmup):
        next(fns)()
    _reset_peak(device)
    times = [timed_call(next(fns), device)[0] for _ in range(steps)]
    row = _row(item, times, _peak_gib(device), "sequential")
    if args.profile:
        row |= profile_step(next(fns), device)
    return row


def measure_interleaved(
    items: list[Item], model: torch.nn.Module, device: torch.device, args: argparse.Namespace
) -> list[dict]:
    """The rows of one (mode, model, phase, batch), its implementations timed in interleaved rounds (see the
    module docstring). An implementation that fails gets its failure's status; the others go on."""
    from ragdot.measure.checks import failure_status
    from ragdot.measure.timing import rotated, timed_call

    rows: list[dict] = [{} for _ in items]
    times: list[list[float]] = [[] for _ in items]
    peaks: list[float | None] = [None for _ in items]
    warmup, steps = _counts(items[0], args)
    per_visit = DECODE_STEPS_PER_VISIT if items[0].phase == "decode" else STEPS_PER_VISIT
    compiled: list = []  # the group's one compile of the model (compile mode)
    late = [0 for _ in items]  # graphs compiled during an implementation's timed steps

    def attempt(i: int, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception as exc:  # OOM and anything an implementation cannot do end only its lane
            status, note = failure_status(exc)
            rows[i] = {"status": status, "note": note}
            _cleanup(model, device)

    def warm(i: int) -> None:
        fns = _step_fn(items[i], model, _prepare(items[i], model, args, compiled), device)
        for _ in range(max(warmup, 1)):
            next(fns)()

    def switch(i: int) -> Iterator[Callable[[], Any]]:
        """The model switched to item i, its first step run untimed (decode: after its prompt's prefill)."""
        fns = _step_fn(items[i], model, _prepare(items[i], model, args, compiled), device)
        next(fns)()
        return fns

    def visit(i: int) -> None:
        fns = switch(i)
        _reset_peak(device)
        n = min(per_visit, steps - len(times[i]))
        before = _graphs()
        times[i].extend(timed_call(next(fns), device)[0] for _ in range(n))
        late[i] += _graphs() - before
        peak = _peak_gib(device)
        peaks[i] = peak if peaks[i] is None or peak is None else max(peaks[i], peak)

    # every implementation's graphs (prefill or train: one each; decode: a static and a dynamic one) must stay
    # in dynamo's cache, or a frame past its recompile limit would silently run eagerly
    with torch._dynamo.config.patch(recompile_limit=max(8, 4 * len(items))):
        for i in range(len(items)):
            attempt(i, functools.partial(warm, i))
        for r in itertools.count():
            live = [i for i in range(len(items)) if not rows[i] and len(times[i]) < steps]
            if not live:
                break
            for i in rotated(live, r):
                attempt(i, functools.partial(visit, i))
    for i, item in enumerate(items):
        if not rows[i]:
            rows[i] = _row(item, times[i], peaks[i], "interleaved")
            if late[i]:
                rows[i]["note"] = f"{late[i]} graph(s) compiled during timed steps"
            if args.profile:
                rows[i] |= profile_step(next(switch(i)), device)
    return rows


def profile_step(fn: Callable[[], Any], device: torch.device, top: int = 12) -> dict[str, Any]:
    """One fn() call under torch.profiler: ``kernel_ms`` (the device time of all its kernels; on a CPU the ops'
    own time) and ``top_kernels`` ("name=ms; ...", the `top` largest, names cut to 70 characters)."""
    from torch.profiler import ProfilerActivity, profile

    from ragdot.cli_common import quiet_native_stderr
    from ragdot.measure.timing import synchronize

    cuda = device.type == "cuda"
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with quiet_native_stderr(not cuda), profile(activities=[activity]) as prof:
        fn()
        synchronize(device)
    own = []
    for evt in prof.key_averages():
        us = getattr(evt, "self_device_time_total", None) if cuda else evt.self_cpu_time_total
        if us is None:  # torch releases before the device-neutral name
            us = getattr(evt, "self_cuda_time_total", 0)
        if us > 0:
            own.append((us / 1e3, evt.key))
    own.sort(reverse=True)
    text = "; ".join(f"{name[:70]}={ms:.3f}" for ms, name in own[:top])
    return {"kernel_ms": sum(ms for ms, _ in own), "top_kernels": text}


def _cleanup(model: torch.nn.Module, device: torch.device) -> None:
    from ragdot.measure.timing import free_memory

    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    free_memory(device)


def _no_experts(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
    """An experts forward that does no expert work: each token's output is its input scaled by the sum of its
    routing weights (one elementwise product, so the router still gets a gradient and the rest of the model
    runs as with real experts). Its step is the floor under every experts implementation's step; never a
    model's result."""
    return hidden_states * top_k_weights.sum(-1, keepdim=True).to(hidden_states.dtype)


# ------------------------------------------------------------------------------------------------ summary
def relative(rows: list[dict]) -> None:
    """Each ragdot row gets ``vs_grouped_mm`` (grouped_mm ms / its ms) and ``mem_vs_grouped_mm`` (its peak /
    grouped_mm's) from the grouped_mm row of the same model, mode, phase and batch; the no_experts row gets
    ``bound_vs_grouped_mm`` (grouped_mm ms / its ms: the largest ``vs_grouped_mm`` any experts implementation
    could reach on that step)."""
    base = {_group(r): r for r in rows if r["impl"] == "grouped_mm" and r.get("status") == "ok"}
    for r in rows:
        b = base.get(_group(r))
        if b is None or r.get("status") != "ok":
            continue
        if r["impl"] == NO_EXPERTS:
            r["bound_vs_grouped_mm"] = b["ms"] / r["ms"]
            continue
        if r["impl"] not in RAGDOT_IMPLS:
            continue
        r["vs_grouped_mm"] = b["ms"] / r["ms"]
        if r.get("peak_gib") and b.get("peak_gib"):
            r["mem_vs_grouped_mm"] = r["peak_gib"] / b["peak_gib"]


def _group(r: dict) -> tuple:
    return r["model"], r["mode"], r["phase"], r["batch"]


def print_table(rows: list[dict], console: Any) -> None:
    from ragdot.measure.console import Table

    table = Table(title="transformers MoE models: ms per step (x: grouped_mm ms / this ms, no_experts: the bound; "
                  "mem: peak / grouped_mm)")
    cols = ("model", "mode", "phase", "batch", "tokens", "impl", "ms", "tok/s", "peak GiB", "x", "mem", "status")
    for c in cols:
        table.add_column(c, justify="left" if c in ("model", "mode", "phase", "impl", "status") else "right")
    for r in rows:
        x = r.get("vs_grouped_mm", r.get("bound_vs_grouped_mm"))
        table.add_row(r["model"], r["mode"], r["phase"], str(r["batch"]), str(r["tokens"]), r["impl"],
                      _fmt(r.get("ms"), "{:.2f}"), _fmt(r.get("tokens_per_s"), "{:,.0f}"),
                      _fmt(r.get("peak_gib"), "{:.1f}"), _fmt(x, "{:.2f}x"),
                      _fmt(r.get("mem_vs_grouped_mm"), "{:.2f}"), r.get("status", ""))  # fmt: skip
    console.print(table)


def _fmt(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


# ------------------------------------------------------------------------------------------------ entry
def _specs(args: argparse.Namespace) -> list[ModelSpec]:
    source = TINY_MODELS if args.tiny else MODELS
    specs = [source[n] for n in (args.models or (["qwen3-moe"] if args.tiny else list(MODELS)))]
    over = {"seq_len": args.seq_len, "train_batch": args.train_batch, "prefill_len": args.prefill_len}
    out = []
    for spec in specs:
        spec = replace(spec, **{k: v for k, v in over.items() if v is not None})
        if args.layers is not None:
            spec = replace(spec, config={**spec.config, "num_hidden_layers": args.layers})
        out.append(spec)
    return out


def _check_args(args: argparse.Namespace) -> None:
    if args.decode_batches is None:
        args.decode_batches = [1, 2] if args.tiny else [1, 8, 64]
    if args.autocast is not None:
        args.autocast = parse_dtype(args.autocast, "bf16", "--autocast")
        if args.autocast not in (torch.bfloat16, torch.float16):
            raise UsageError(f"--autocast must be bf16 or fp16, got {args.autocast}")
    if args.tiny:
        args.steps, args.warmup = min(args.steps, 2), min(args.warmup, 1)
        args.impls = args.impls or ["grouped_mm", "ragdot", "eager"]
    args.impls = args.impls or list(IMPLS)
    args.modes = args.modes or (["eager"] if args.tiny else list(MODES))
    args.phases = args.phases or list(PHASES)


def run(args: argparse.Namespace) -> int:
    try:
        import transformers

        import ragdot.integrations.transformers as rt
    except ImportError as exc:
        raise UsageError(f"bench-models needs transformers >= 5 (pip install 'ragdot[transformers]'): {exc}") from None
    from ragdot.measure.console import Console
    from ragdot.measure.progress import KeepOnInterrupt, Progress

    _check_args(args)
    device = parse_device(args.device or ("cpu" if args.tiny or not torch.cuda.is_available() else None))
    dtype = parse_dtype(args.dtype, "bf16" if device.type == "cuda" else "fp32")
    rt.register()
    rt.register(rt.FUSED_NAME, fused=True)
    for name in set(args.impls) & set(EXTRA):
        rt.register(name, **EXTRA[name])
    if NO_EXPERTS in args.impls:
        rt._interface().register(NO_EXPERTS, _no_experts)
    specs = _specs(args)
    items = plan(specs, args)
    console = Console(quiet=args.quiet)
    if not console.is_terminal:
        console = Console(width=max(console.width, 150), quiet=args.quiet)
    meta = records.run_meta(device, dtype, with_triton=True) | {
        "clock": CLOCK_CUDA if device.type == "cuda" else CLOCK_CPU, "steps": args.steps, "warmup": args.warmup,
        "transformers": transformers.__version__, "compile_backend": args.compile_backend,
        "autocast": None if args.autocast is None else str(args.autocast).removeprefix("torch."),
        "models": {s.name: {"note": s.note, "seq_len": s.seq_len, "train_batch": s.train_batch,
                            "prefill_len": s.prefill_len, **s.config} for s in specs},
    }  # fmt: skip
    writer = records.RowWriter(check_out(args.out), f"bench-models-{safe_name(meta['gpu'])}", meta)
    progress = Progress(len(items), budget=args.budget,
                        say=None if args.quiet else lambda line: console.print(line, markup=False))  # fmt: skip
    with KeepOnInterrupt(writer.rows) as kept:
        _run_items(items, device, dtype, args, writer, progress)
    relative(writer.rows)
    writer.rewrite()
    if not args.quiet:
        print_table(writer.rows, console)
    print("wrote " + ", ".join(str(f) for f in writer.files))
    return kept.status


def _groups(items: list[Item], sequential: bool) -> Iterator[list[Item]]:
    """The items in order, the implementations of one (mode, model, phase, batch) together (unless
    `sequential`: one by one)."""
    group: list[Item] = []
    for item in items:
        first = group[0] if group else None
        if first is not None and (sequential or (item.mode, item.model.name, item.phase, item.batch)
                                  != (first.mode, first.model.name, first.phase, first.batch)):
            yield group
            group = []
        group.append(item)
    if group:
        yield group


def _run_items(items: list[Item], device, dtype, args, writer, progress) -> None:
    """Every item in order, one model built at a time; after the budget, the rest are 'budget' rows."""
    from ragdot.measure.checks import failure_status

    model, built, oom, left = None, None, set(), list(items)
    for group in _groups(items, args.sequential):
        if progress.spent():
            for rest in left:
                writer.add(rest.key() | {"status": "budget"})
            return
        left = left[len(group):]
        head = group[0]
        skip = [i.mode == "compile" and (i.model.name, i.phase, i.batch, i.impl) in oom for i in group]
        todo = [i for i, s in zip(group, skip, strict=True) if not s]
        done: list[dict] = []
        try:
            if todo and built is not head.model:
                model = None
                _free(device)
                model, built = build_model(head.model, device, dtype), head.model
            if len(todo) > 1:
                done = measure_interleaved(todo, model, device, args)
            elif todo:
                done = [measure_item(todo[0], model, device, args)]
        except Exception as exc:  # OOM and anything an implementation cannot do become rows, the run goes on
            status, note = failure_status(exc)
            done = [{"status": status, "note": note} for _ in todo]
        if model is not None:
            _cleanup(model, device)
        ran = iter(done)
        results = [{"status": "OOM", "note": "out of memory in eager mode; not compiled"} if s else next(ran)
                   for s in skip]
        for item, result in zip(group, results, strict=True):
            row = item.key() | result
            row.setdefault("status", "ok")
            if row["status"] == "OOM" and item.mode == "eager":
                oom.add((item.model.name, item.phase, item.batch, item.impl))
            writer.add(row)
            said = f"{row['ms']:.2f} ms" if row["status"] == "ok" else row["status"]
            progress.done(f"{item.mode} {item.model.name} {item.phase} b{item.batch} {item.impl}: {said}")


def _free(device: torch.device) -> None:
    from ragdot.measure.timing import free_memory

    torch._dynamo.reset()
    free_memory(device)
