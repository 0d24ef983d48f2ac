"""ragdot's measurement suites: named sets of `ragdot` CLI runs and maintained probes, for one machine.

    python benchmarks/suite.py --list                       # the suites, their steps and time budgets
    python benchmarks/suite.py checks anchors --out DIR     # run suites in the order given
    python benchmarks/suite.py moe --seconds 600            # one budget for every suite named
    python benchmarks/suite.py tune anchors --seconds tune=300 anchors=400
    python benchmarks/suite.py verify --pack --out $OUT     # DIR gets only suite-log.txt and results.tgz
    python benchmarks/suite.py smoke                        # CPU: the runner itself and the quick CLI runs
    python benchmarks/suite.py headline --require-gpu H200 --pack --out $OUT   # nothing runs on another GPU

Each suite writes into <out>/<suite>/ (every step's terminal output as <step>.txt, its result files beside
it); <out>/suite-log.txt stamps the machine, the commit, every command, its exit status, time and last
lines; <out>/suite-summary.json holds the same as records. With --pack the suites run in a scratch folder
and <out> receives only the log, the summary and results.tgz: for a machine that brings back few files.

Every run uses a tune cache of its own (<out>/cache, empty at the start: `auto` then reads only the
shipped tune file), shared by the suites of the run in order, so `tune anchors` benchmarks the fresh tune;
`verify` always reads an empty one. Children run with this checkout's src/ first on PYTHONPATH and with
RAGDOT_COMMIT set (--commit, else `git rev-parse --short HEAD`), so result rows name the commit even where
a copied checkout has stale git metadata. A step that outlives its share of the budget is stopped (exit
status 124 in the log) and the suite goes on; Ctrl-C stops the current step and still packs what is there.
Exit status: 0 when every step passed, 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable or "python3"
RAGDOT = ("{py}", "-m", "ragdot")
TARGETS = ("--targets", "benchmarks/targets-h200.json")  # reference numbers; they apply on an H200 only
ANCHOR_FAST = ("--anchors", "--backends", "torch", "triton", "gluon", "auto", "--no-xla", *TARGETS)  # gluon: sm_90
LAYER_CONFIGS = ("qwen3-30b-a3b", "deepseek2-16b", "gpt-oss-like", "deepseek3-671b-reduced")  # the layer targets
NARROW = ("32768,2880,360,128", "8192,2048,640,64")  # ragged-M widths where a 256-wide tile computes 33% / 20% extra


@dataclass(frozen=True)
class Step:
    """One command of a suite. `argv` may hold {out} (the suite's folder), {cache} (the run's tune cache),
    {py} (this Python), {sanitizer} (compute-sanitizer) and {ncu} (Nsight Compute); `after` runs in this process
    once it passed."""

    name: str
    argv: tuple[str, ...]
    seconds: float
    env: tuple[tuple[str, str], ...] = ()
    tail: int = 15
    after: Callable[[Path, Path], None] | None = None


@dataclass(frozen=True)
class Suite:
    help: str
    steps: tuple[Step, ...]
    gpu: bool = True

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)


def _copy_tune(out: Path, cache: Path) -> None:
    src = cache / "tune.json"
    if src.is_file():
        shutil.copy2(src, out / "tune.json")


def _suites() -> dict[str, Suite]:
    memcheck_env = (("PYTORCH_NO_CUDA_MEMORY_CACHING", "1"),)
    empty_cache = (("RAGDOT_CACHE_DIR", "{out}/empty-cache"),)
    bench = (*RAGDOT, "bench")
    moe = (*RAGDOT, "moe-bench", *TARGETS)
    dev = ("{py}", "benchmarks/triton_dev.py")
    rm_classes = ("--classes", "fwd_wi,fwd_wo,dgrad_wi,dgrad_wo")
    # Nsight Compute around benchmarks/profile_cell.py's profiled range (clocks left alone, as METHOD says)
    ncu = ("{ncu}", "--clock-control", "none", "--profile-from-start", "off", "--set", "full", "--force-overwrite",
           "--export")
    cell = ("{py}", "benchmarks/profile_cell.py")
    return {
        "smoke": Suite("CPU smoke run: bench --quick, moe-bench --quick, host-bench (checks the runner)", (
            Step("bench", (*bench, "--quick", "--no-plots", "--out", "{out}"), 240),
            Step("moe", (*moe, "--quick", "--no-plots", "--out", "{out}/moe"), 240),
            Step("host", (*RAGDOT, "host-bench", "--out", "{out}"), 120),
        ), gpu=False),
        "tests": Suite("the whole test suite on the GPU (CUDA tensors, bf16), stopping at the first failure", (
            Step("pytest", ("{py}", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests"), 600),
        )),
        "checks": Suite("the gpu-marked tests, then compute-sanitizer memcheck on benchmarks/memcheck_calls.py", (
            Step("gpu-tests", ("{py}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests"), 420,
                 tail=3),
            Step("memcheck", ("{sanitizer}", "--tool", "memcheck", "--error-exitcode", "3", "--print-limit", "50",
                              "{py}", "benchmarks/memcheck_calls.py"), 240, memcheck_env, tail=6),
        )),
        "tune": Suite("ragdot tune of the 8 anchor shapes (7 configs, 20 graph replays each); tune.json kept", (
            Step("tune", (*RAGDOT, "tune", "--shapes", "anchor", "--max-configs", "7", "--warmup", "3",
                          "--iters", "20"), 260, tail=5, after=_copy_tune),
        )),
        "anchors": Suite("ragdot bench on the anchor shapes: vendor/torch/triton/gluon/auto, eager and graph clocks", (
            Step("balanced", (*bench, *ANCHOR_FAST, "--out", "{out}"), 420, tail=30),
            Step("skewed-empty", (*bench, *ANCHOR_FAST, "--routing", "skewed", "empty", "--max-seconds", "0.15",
                                  "--out", "{out}"), 300, tail=30),
        )),
        "baselines": Suite("the slow baselines on the anchor shapes: padded and XLA beside vendor/torch, graph clock", (
            Step("padded-xla", (*bench, *TARGETS, "--anchors", "--backends", "padded", "torch", "xla", "--cuda-graphs",
                                "--max-seconds", "0.3", "--out", "{out}"), 420, tail=30),
        )),
        "verify": Suite("shipped tune only (empty cache): every anchor cell has an entry; bench twice, two processes", (
            Step("shipped", ("{py}", "benchmarks/check_shipped_tune.py"), 60, empty_cache, tail=2),
            Step("bench", (*bench, *ANCHOR_FAST, "--routing", "balanced", "skewed", "empty", "--cuda-graphs",
                           "--max-seconds", "0.15", "--no-plots", "--out", "{out}"), 150, empty_cache, tail=30),
            Step("bench-again", (*bench, *ANCHOR_FAST, "--cuda-graphs", "--max-seconds", "0.15", "--no-plots",
                                 "--out", "{out}"), 100, empty_cache, tail=30),
        )),
        "moe": Suite("ragdot moe-bench: train steps of every config (graph clock, then eager), 16k-token runs", (
            Step("graph", (*moe, "--max-seconds", "3", "--out", "{out}/graph"), 330, tail=30),
            Step("eager", (*moe, "--eager", "--max-seconds", "3", "--no-profile", "--out", "{out}/eager"), 300,
                 tail=30),
            Step("16k-llama4", (*moe, "--configs", "llama4-17b-16e", "--batch", "16", "--max-seconds", "2",
                                "--out", "{out}/16k-llama4-17b-16e"), 80),
            Step("16k-deepseek2", (*moe, "--configs", "deepseek2-16b", "--batch", "32", "--max-seconds", "2",
                                   "--out", "{out}/16k-deepseek2-16b"), 80),
            Step("16k-deepseek3", (*moe, "--configs", "deepseek3-671b-reduced", "--batch", "32", "--max-seconds",
                                   "2", "--out", "{out}/16k-deepseek3-671b-reduced"), 80),
        )),
        "layer": Suite("ragdot moe-bench --layer: one MoE layer fwd+bwd against the plain-PyTorch peer", (
            Step("eager", (*moe, "--layer", "--modes", "eager", "--tokens", "8192", "32768", "--configs",
                           *LAYER_CONFIGS, "--variants", "peer", "sparse-auto", "sparse-unfused", "--out", "{out}"),
                 180, tail=40),
            Step("compile", (*moe, "--layer", "--modes", "compile", "--tokens", "8192", "32768", "--configs",
                             *LAYER_CONFIGS, "--variants", "peer", "sparse-auto", "sparse-unfused", "--budget", "230",
                             "--out", "{out}"), 260, tail=30),
        )),
        # one GPU command of about 460 s: what the README's "at a glance" table reports from the H200, in its order
        "headline": Suite("the README's headline numbers again: host time per call (two shapes), the 48 anchors on "
                          "three routings in one process, the two train steps under 1.3x with their floor and "
                          "kernel split (graph clock, then eager), the MoE layer eager against peer", (
            Step("host", (*RAGDOT, "host-bench", "--shapes", "qwen3-30b-a3b", "deepseek3-test", "--systems", "raw",
                          "raw+cumsum", "ragdot-torch", "ragdot-triton", "ragdot-auto", "--repeats", "9", "--out",
                          "{out}/host"), 60, tail=20),
            Step("anchors", (*bench, *ANCHOR_FAST, "--routing", "balanced", "skewed", "empty", "--max-seconds",
                             "0.12", "--no-plots", "--out", "{out}/anchors"), 150, tail=30),
            Step("steps", (*moe, "--configs", "deepseek2-16b", "qwen3-235b-a22b", "--variants", "sparse-auto",
                           "dense_drop", "no_experts", "--max-seconds", "3", "--no-plots", "--out", "{out}/steps"),
                 90, tail=20),
            Step("steps-eager", (*moe, "--configs", "deepseek2-16b", "qwen3-235b-a22b", "--variants", "sparse-auto",
                                 "dense_drop", "--eager", "--max-seconds", "3", "--no-profile", "--no-plots", "--out",
                                 "{out}/steps-eager"), 60, tail=16),
            Step("layer", (*moe, "--layer", "--modes", "eager", "--tokens", "8192", "32768", "--configs",
                           *LAYER_CONFIGS, "--variants", "peer", "sparse-auto", "--no-plots", "--out", "{out}/layer"),
                 100, tail=24),
        )),
        "host": Suite("ragdot host-bench (host time per call), then benchmarks/host_profile.py (its pieces)", (
            Step("host-bench", (*RAGDOT, "host-bench", "--out", "{out}"), 300, tail=60),
            Step("profile", ("{py}", "benchmarks/host_profile.py"), 120, tail=40),
        )),
        "mxfp8": Suite("ragdot bench-mxfp8: the default path and the fastest kernel, then every path + strip-downs", (
            Step("default", (*RAGDOT, "bench-mxfp8", *TARGETS, "--variants", "dequant,bits-128x128w4", "--seconds",
                             "0.2", "--out", "{out}"), 240,
                 tail=30),
            Step("all-paths", (*RAGDOT, "bench-mxfp8", *TARGETS, "--strip", "--seconds", "0.2", "--budget", "200",
                            "--out", "{out}/all-paths"), 240, tail=30),
        )),
        "gluon": Suite("the Gluon kernels: gluon_probe.py, gluon_gpu.py (its tests, the timing), every config", (
            Step("probe", ("{py}", "benchmarks/gluon_probe.py", "--out", "{out}", "--timeout", "60"), 330, tail=8),
            Step("gpu", ("{py}", "benchmarks/gluon_gpu.py", "--out", "{out}", "--budget", "230", "--tests-timeout",
                         "110", "--classes", "wgrad_wi", "wgrad_wo", "fwd_wi", "dgrad_wi"), 260, tail=20),
            # every candidate config (ping-pong too) as its own system, per cell the best: about 60 s on the H200
            Step("configs", ("{py}", "benchmarks/gluon_gpu.py", "--out", "{out}/configs", "--skip-tests", "--configs",
                             "all", "--reps", "10", "--budget", "300", "--cell-timeout", "45"), 320, tail=30),
        )),
        "models": Suite("ragdot bench-models: whole transformers models per experts implementation", (
            Step("bench-models", (*RAGDOT, "bench-models", "--out", "{out}", "--budget", "270"), 330, tail=30),
        )),
        "jax": Suite("benchmarks/jax_gpu.py: ragdot.jax correctness, host time, profile and the bench cells", (
            Step("jax", ("{py}", "benchmarks/jax_gpu.py", "--out", "{out}", "--steps", "env", "check", "host",
                         "profile", "--budget", "320"), 330, tail=30),
            # the device-time target: ragdot-jax's program clock beside triton's graph clock (about 100 s)
            Step("device", ("{py}", "benchmarks/jax_gpu.py", "--out", "{out}/device", "--steps", "bench",
                            "--systems", "triton", "ragdot-jax", "--budget", "200"), 210, tail=12),
            # against xla and tokamax (with tokamax on PYTHONPATH: about 420 s)
            Step("peers", ("{py}", "benchmarks/jax_gpu.py", "--out", "{out}/peers", "--steps", "bench", "--budget",
                           "470"), 480, tail=12),
            Step("cells", ("{py}", "benchmarks/jax_cell_probe.py", "--out", "{out}"), 120, tail=8),
            # the FFI bridge: XLA's loop floor per turn, and every anchor cell's kernels (CUPTI) beside triton's
            Step("ffi", ("{py}", "benchmarks/jax_cell_probe.py", "--out", "{out}/ffi", "--sections", "loop",
                         "kernels"), 150, tail=8),
            # tokamax, where benchmarks/tokamax_site.sh put it on PYTHONPATH (exit 2 and one line otherwise)
            Step("tokamax", ("{py}", "benchmarks/tokamax_check.py", "--out", "{out}/tokamax_check.jsonl"), 90,
                 tail=12),
        )),
        "router": Suite("the router's kernels: GPU tests, then eager train steps with them on and off (one process)", (
            Step("gpu-tests", ("{py}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                               "tests/test_router_losses.py", "tests/test_router_topk.py", "tests/test_moe.py"), 150,
                 tail=8),
            Step("ab-topk", ("{py}", "benchmarks/router_kernels_ab.py", "--kernels", "topk", "--rounds", "8",
                             "--configs", "deepseek3-test", "deepseek2-16b", "qwen3-30b-a3b", "gemma4-26b"), 180,
                 tail=10),
            Step("ab-both", ("{py}", "benchmarks/router_kernels_ab.py", "--kernels", "losses", "topk", "--rounds", "8",
                             "--configs", "deepseek3-test", "deepseek2-16b", "qwen3-30b-a3b", "gemma4-26b"), 180,
                 tail=10),
        )),
        "inductor-out": Suite("ragdot's ops lowered to their .out overloads (the default where torch lacks that "
                              "lowering) against inductor's own (RAGDOT_INDUCTOR_OUT=0): GPU tests, compiled "
                              "gpt-oss-like peak (off / on) and train step", (
            Step("gpu-tests", ("{py}", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/test_inductor_lowering.py", "tests/test_api.py",
                               "-k", "lowering or out_variant or opcheck"), 120, tail=8),
            Step("peak-off", ("{py}", "benchmarks/peak_probe.py", "--modes", "compile", "--timeline", "1024",
                              "--out", "{out}/peak-off"), 150, (("RAGDOT_INDUCTOR_OUT", "0"),), tail=30),
            Step("peak-on", ("{py}", "benchmarks/peak_probe.py", "--modes", "compile", "--impls", "ragdot",
                             "--timeline", "1024", "--out", "{out}/peak-on"), 100, tail=20),
            Step("models", (*RAGDOT, "bench-models", "--models", "gpt-oss", "--phases", "train", "--modes",
                            "compile", "--impls", "grouped_mm", "ragdot", "--out", "{out}/models"), 200, tail=10),
        )),
        "infer-compile": Suite("compiled prefill and decode of the three transformers models, grouped_mm and ragdot "
                               "interleaved (CUDA events around whole steps), after the compiled-path GPU tests", (
            Step("gpu-tests", ("{py}", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/test_inductor_lowering.py", "tests/test_moe_compile.py",
                               "tests/test_transformers_integration.py", "tests/test_transformers_experts.py", "-k",
                               "lowering or compile or inductor"), 150,
                 tail=8),
            Step("models", (*RAGDOT, "bench-models", "--modes", "compile", "--phases", "prefill", "decode", "--impls",
                            "grouped_mm", "ragdot", "--budget", "420", "--out", "{out}"), 480, tail=30),
        )),
        "decode": Suite("decode-sized calls: ragged_m tiles for <= 64 rows per group against the raw call (graph "
                        "clock), then compiled decode of gpt-oss-like and DeepSeek-V3-like, interleaved", (
            Step("tiles", ("{py}", "benchmarks/decode_tiles.py", "--out", "{out}/tiles"), 150, tail=60),
            Step("models", (*RAGDOT, "bench-models", "--models", "gpt-oss", "deepseek-v3", "--modes", "compile",
                            "--phases", "decode", "--impls", "grouped_mm", "ragdot", "--budget", "400", "--out",
                            "{out}/models"), 440, tail=20),
        )),
        "narrow": Suite("ragged-M at output widths 360 and 640 (long groups): the tuner's times of every tile there "
                        "(128- and 256-wide among them, the vendor beside), then the call path against the vendor, "
                        "eager and graph clocks (docs/history.md, 2026-12-06, after the night)", (
            Step("tune", (*RAGDOT, "tune", "--shapes", *NARROW, "--classes", "fwd_wi", "dgrad_wo", "--max-configs",
                          "8", "--out", "{out}/tune"), 240, tail=40),
            Step("bench", (*RAGDOT, "bench", "--shapes", *NARROW, "--classes", "fwd_wi", "dgrad_wo", "--backends",
                           "triton", "auto", "--no-xla", "--routing", "balanced", "skewed", "--clocks", "eager",
                           "graph", "--max-seconds", "0.2", "--no-plots", "--out", "{out}/bench"), 150, tail=30),
        )),
        "bounds": Suite("whole transformers models beside a step without expert work (no_experts: the most an "
                        "experts path can gain), then the compiled decode step's guard check and its steps", (
            Step("train", (*RAGDOT, "bench-models", "--models", "gpt-oss", "qwen3-moe", "--phases", "train", "--modes",
                           "eager", "compile", "--impls", "grouped_mm", "ragdot", "no_experts", "--budget", "300",
                           "--out", "{out}/train"), 340, tail=20),
            # the guard tree does not depend on the widths: tiny 4-layer configs, on the GPU's tensors
            Step("guards", ("{py}", "benchmarks/guard_cost.py", "--device", "cuda", "--model", "gpt-oss", "--layers",
                            "4"), 120, tail=3),
            Step("decode", (*RAGDOT, "bench-models", "--models", "gpt-oss", "--modes", "compile", "--phases", "decode",
                            "--decode-batches", "1", "8", "--impls", "grouped_mm", "ragdot", "--budget", "300",
                            "--out", "{out}/decode"), 340, tail=12),
        )),
        "tune-vs-call": Suite("the weight-gradient cells where auto trails the forced triton tile: the tuner's "
                              "timing against the call path's, one process (docs/gluon.md)", (
            Step("llama4-wgrad_wi", ("{py}", "benchmarks/tune_vs_call.py", "--shape", "llama4-17b-16e", "--cls",
                                     "wgrad_wi"), 150, tail=14),
            Step("qwen3-wgrad_wo", ("{py}", "benchmarks/tune_vs_call.py", "--shape", "qwen3-30b-a3b", "--cls",
                                    "wgrad_wo"), 120, tail=14),
        )),
        "frontends": Suite("the calls other code makes: ragdot.grouped_mm's four forms against the raw "
                           "torch._grouped_mm (eager and graph clocks) after its GPU tests, and ragdot.jax's "
                           "checks (forward, grad and jvp through the FFI replay)", (
            # the batch kernel's prepared launch: grouped_mm's 3-D x 3-D form, ragdot.jax's batch mode (FFI)
            Step("gpu-tests", ("{py}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_grouped.py",
                               "tests/test_jax.py", "tests/test_jax_ffi.py", "tests/test_triton_kernels.py",
                               "tests/test_triton_ragged_k.py", "-k",
                               "grouped or batch or gpu or shard_map"), 200, tail=8),
            Step("forms", ("{py}", "benchmarks/grouped_forms.py", "--out", "{out}/forms"), 150, tail=12),
            Step("jax-check", ("{py}", "benchmarks/jax_gpu.py", "--out", "{out}/jax", "--steps", "env", "check",
                               "--budget", "200"), 220, tail=12),
        )),
        "probes": Suite("diagnosis probes: graph capture, host time under GPU load, the MoE layer host time", (
            Step("capture", ("{py}", "benchmarks/capture_probe.py"), 240, tail=12),
            Step("host-load", ("{py}", "benchmarks/host_load_probe.py"), 240, tail=30),
            Step("moe-host", ("{py}", "benchmarks/moe_host_profile.py", "--device", "cuda", "--out", "{out}"), 240,
                 tail=20),
            # one MoE layer's eager step against its replay, the GPU's idle time by phase and host op
            Step("layer-gaps", ("{py}", "benchmarks/layer_gaps.py", "--configs", "gpt-oss-like", "qwen3-30b-a3b",
                                "deepseek2-16b", "deepseek3-671b-reduced", "--out", "{out}/layer-gaps"), 360, tail=40),
            Step("layer-host", ("{py}", "benchmarks/layer_host.py", "--configs", "qwen3-30b-a3b", "deepseek2-16b",
                                "--tokens", "4096"), 150, tail=40),
        )),
        "amp": Suite("mixed precision with float32 parameters: the autocast tests on the GPU, the MoE layer under "
                     "autocast (eager clock), whole transformers models with float32 parameters under bf16 autocast", (
            Step("gpu-tests", ("{py}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_autocast.py",
                               "tests/test_fused_moe.py", "tests/test_transformers_integration.py",
                               "tests/test_transformers_experts.py", "-k", "master or autocast"), 200, tail=8),
            Step("layer", ("{py}", "benchmarks/autocast_layer.py", "--configs", "qwen3-30b-a3b", "deepseek2-16b",
                           "--tokens", "8192", "--rounds", "2", "--json", "{out}/autocast.json"), 200, tail=12),
            Step("models", (*RAGDOT, "bench-models", "--models", "qwen3-moe", "deepseek-v3", "--phases", "train",
                            "--modes", "eager", "--dtype", "fp32", "--autocast", "bf16", "--impls", "grouped_mm",
                            "ragdot", "ragdot_unfused", "--budget", "230", "--out", "{out}/models"), 260, tail=14),
            Step("gpt-oss", (*RAGDOT, "bench-models", "--models", "gpt-oss", "--layers", "2", "--phases", "train",
                             "--modes", "eager", "--dtype", "fp32", "--autocast", "bf16", "--impls", "grouped_mm",
                             "ragdot", "--steps", "4", "--budget", "240", "--out", "{out}/gpt-oss"), 260, tail=12),
        )),
        "fused": Suite("the fused MoE block against the unfused layer (fused_gpu.py), its kernels' tile configs "
                       "at two layer shapes (fused_sweep.py; graph clock), one step's kernel time (layer_profile.py; "
                       "CUPTI), the layer's ragged-M tiles on routed group sizes (tail_tiles.py; graph clock) and "
                       "its last weight gradient from x's token rows (wgrad_rows.py; graph and eager clocks)", (
            Step("layer", ("{py}", "benchmarks/fused_gpu.py", "--tokens", "8192", "--budget-s", "250", "--out",
                           "{out}/layer"), 330, tail=40),
            Step("deepseek-v3", ("{py}", "benchmarks/fused_sweep.py", "--limit", "10", "--out", "{out}/deepseek-v3"),
                 300, tail=12),
            Step("qwen3", ("{py}", "benchmarks/fused_sweep.py", "--dim", "2048", "--hidden", "768", "--experts", "128",
                           "--limit", "10", "--out", "{out}/qwen3"), 240, tail=12),
            Step("kernel-time", ("{py}", "benchmarks/layer_profile.py", "--out", "{out}/profile.json"), 150, tail=60),
            Step("routed-tiles", ("{py}", "benchmarks/tail_tiles.py", "--out", "{out}/tail.json"), 240, tail=40),
            Step("wgrad-rows", ("{py}", "benchmarks/wgrad_rows.py", "--out", "{out}/wgrad.json"), 180, tail=50),
        )),
        "sol": Suite("where the speed of light is not reached: the device's write paths (write_ceiling.py: fill, "
                     "memset, Triton stores, TMA tile stores; graph clock) at two weight-gradient output sizes, "
                     "ragged-M output tiles through TMA stores against pointer stores (kernel_ab.py), then the "
                     "lowest ragged-M cells on balanced, skewed and empty routing in one process", (
            Step("write-deepseek3", ("{py}", "benchmarks/write_ceiling.py"), 60, tail=14),
            Step("write-qwen3", ("{py}", "benchmarks/write_ceiling.py", "--groups", "128", "--m", "2048", "--n",
                                 "768", "--tokens", "10240"), 90, tail=14),
            # ragged_m's output tiles through a ragged TMA view ("old": TMA_STORE on) against its pointer stores
            Step("tma-store", ("{py}", "benchmarks/kernel_ab.py", "--module", "ragdot.kernels.ragged_m", "--old",
                               "src/ragdot/kernels/ragged_m.py", "--old-set", "TMA_STORE=True", "--shapes",
                               "mixtral-8x7b", "qwen3-235b-a22b", "qwen3-30b-a3b", "deepseek3-test", "--routing",
                               "balanced", "skewed", "--out", "{out}/tma-store"), 240, tail=20),
            Step("routing", (*RAGDOT, "bench", "--shapes", "mixtral-8x7b", "qwen3-235b-a22b", "deepseek3-test",
                             "--classes", "fwd_wi", "fwd_wo", "dgrad_wi", "dgrad_wo", "--backends", "torch",
                             "triton", "auto", "--no-xla", *TARGETS, "--routing", "balanced", "skewed", "empty",
                             "--max-seconds", "0.15", "--no-plots", "--out", "{out}"), 300, tail=20),
        )),
        "store": Suite("the weight gradients' store path by group length (pointer stores for short groups) against "
                       "TMA everywhere: both kernels A/B'd on the tuned configs (graph clock), then the 16 "
                       "weight-gradient anchor cells on three routings and the gpt-oss-like layer at 8192 tokens "
                       "(256 rows a group: the Gluon bound's edge)", (
            Step("gluon-ab", ("{py}", "benchmarks/kernel_ab.py", "--module", "ragdot.kernels.gluon.ragged_k", "--old",
                              "src/ragdot/kernels/gluon/ragged_k.py", "--old-set", "EPILOGUE='tma'", "--routing",
                              "balanced", "skewed", "--configs", "tuned", "--out", "{out}/gluon-ab"), 150, tail=6),
            Step("triton-ab", ("{py}", "benchmarks/kernel_ab.py", "--module", "ragdot.kernels.ragged_k", "--old",
                               "src/ragdot/kernels/ragged_k.py", "--old-set", "TMA_STORE=True", "--routing",
                               "balanced", "skewed", "--configs", "tuned", "--out", "{out}/triton-ab"), 120, tail=6),
            Step("wgrad", (*RAGDOT, "bench", "--anchors", "--classes", "wgrad_wi", "wgrad_wo", "--backends", "triton",
                           "gluon", "auto", "--no-xla", *TARGETS, "--routing", "balanced", "skewed", "empty",
                           "--max-seconds", "0.15", "--no-plots", "--out", "{out}"), 150, tail=20),
            Step("layer", (*RAGDOT, "moe-bench", *TARGETS, "--layer", "--modes", "eager", "--tokens", "8192",
                           "--configs", "gpt-oss-like", "qwen3-30b-a3b", "--variants", "peer", "sparse-auto",
                           "--out", "{out}"), 90, tail=14),
        )),
        "clock": Suite("benchmarks/sustained_rate.py: mixtral-8x7b's forward and weight gradient on burst, graph and "
                       "sustained clocks beside dense torch.mm, the vendor and auto, with the SM clock and power", (
            Step("sustained", ("{py}", "benchmarks/sustained_rate.py", "--shapes", "mixtral-8x7b", "--classes",
                               "fwd_wi", "wgrad_wi"), 90, tail=10),
        )),
        "profile": Suite("Nsight Compute on the open diagnoses: Gluon vs Triton ragged-M, the skewed Gluon wgrad", (
            # the same 128x256x64 three-stage tile, 619 TFLOP/s in Gluon and 741 in Triton (docs/gluon.md)
            Step("ragged-m", (*ncu, "{out}/mixtral-fwd_wi", *cell, "--shape", "mixtral-8x7b", "--cls", "fwd_wi",
                              "--systems", "triton:128x256x64 g8 w8 s3 p1 tma flat", "gluon:128x256x64s3w8g8r24"),
                 240, tail=12),
            # the cooperative 128x256x32 weight gradient, 9-17% slower on skewed sizes than on balanced ones
            Step("wgrad-skewed", (*ncu, "{out}/qwen3-235b-wgrad_wi-skewed", *cell, "--shape", "qwen3-235b-a22b",
                                  "--cls", "wgrad_wi", "--routing", "skewed", "--systems", "vendor",
                                  "gluon:128x256x32s6w8g8r24"), 200, tail=12),
            Step("wgrad-balanced", (*ncu, "{out}/qwen3-235b-wgrad_wi-balanced", *cell, "--shape", "qwen3-235b-a22b",
                                    "--cls", "wgrad_wi", "--systems", "vendor", "gluon:128x256x32s6w8g8r24"),
                 200, tail=12),
        )),
        "sweep": Suite("benchmarks/triton_dev.py: Triton tile-config sweeps against torch._grouped_mm (graph clock)", (
            Step("wgrad", (*dev, "--out", "{out}/wgrad", "--sweep", "--graph", "--routing", "balanced",
                           "--classes", "wgrad_wi,wgrad_wo"), 260, tail=40),
            Step("ragged-m", (*dev, "--out", "{out}/ragged-m", "--sweep", "--graph", "--reps", "9", "--routing",
                              "balanced", *rm_classes), 330, tail=40),
            Step("ragged-m-skewed", (*dev, "--out", "{out}/ragged-m-skewed", "--sweep", "--graph", "--reps", "9",
                                     "--routing", "skewed", "--sweep-routing", "skewed", "--shapes",
                                     "qwen3-235b-a22b", *rm_classes), 100, tail=40),
        )),
    }


SUITES = _suites()


# ------------------------------------------------------------------------------------------------ options
def parse_seconds(items: Sequence[str], names: Sequence[str]) -> dict[str, float]:
    """`--seconds 600` (every suite named) and/or `--seconds moe=400 anchors=300` -> {suite: seconds}."""
    budgets: dict[str, float] = {}
    for item in items:
        name, _, value = item.rpartition("=")
        targets = [name] if name else list(names)
        if name and name not in names:
            raise ValueError(f"--seconds: {name!r} is not one of the suites named ({', '.join(names)})")
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"--seconds: {item!r} is not SECONDS or SUITE=SECONDS") from None
        if seconds <= 0:
            raise ValueError(f"--seconds: {item!r} must be positive")
        budgets.update({t: seconds for t in targets})
    return budgets


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/suite.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suites", nargs="*", metavar="SUITE", help=f"suites to run in order: {', '.join(SUITES)}")
    p.add_argument("--list", action="store_true", help="list the suites and their steps, run nothing")
    p.add_argument("--out", type=Path, help="result folder (default $OUT, else out/suite-<date>)")
    p.add_argument("--seconds", nargs="+", default=[], metavar="[SUITE=]S",
                   help="time budget per suite, shared by its steps in proportion to their defaults")
    p.add_argument("--commit", help="commit id for the result rows (default: git rev-parse --short HEAD)")
    p.add_argument("--pack", action="store_true", help="leave only suite-log.txt, the summary and results.tgz")
    p.add_argument("--dry-run", action="store_true", help="print the commands with their time limits, run nothing")
    p.add_argument("--no-gpu-check", action="store_true", help="run GPU suites even where torch sees no CUDA")
    p.add_argument("--require-gpu", metavar="NAME",
                   help="run nothing (exit 3) unless nvidia-smi names a GPU containing NAME, e.g. H200")
    return p


def list_suites() -> str:
    lines = []
    for name, suite in SUITES.items():
        where = "GPU" if suite.gpu else "any device"
        lines.append(f"{name:10s} {suite.help} [{where}, {suite.seconds:.0f} s]")
        lines += [f"  {s.name:16s} {s.seconds:4.0f} s  {' '.join(s.argv).replace('{py}', 'python3')}"
                  for s in suite.steps]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ running
@dataclass
class Run:
    out: Path
    cache: Path
    log_path: Path
    env: dict[str, str]
    records: list[dict] = field(default_factory=list)

    def log(self, text: str) -> None:
        line = f"== {time.strftime('%H:%M:%S')} {text}"
        print(line, flush=True)
        with open(self.log_path, "a") as f:
            f.write(line + "\n")

    def note(self, text: str) -> None:  # lines without a stamp (a step's last lines)
        if text:
            print(text, flush=True)
            with open(self.log_path, "a") as f:
                f.write(text.rstrip("\n") + "\n")


CUDA_TOOLS = {"{sanitizer}": "compute-sanitizer", "{ncu}": "ncu"}  # placeholder -> executable


def _cuda_tool(name: str) -> str | None:
    """`name` on PATH, else in /usr/local/cuda*/bin."""
    found = shutil.which(name)
    if found:
        return found
    for base in sorted(Path("/usr/local").glob("cuda*")):
        if (base / "bin" / name).is_file():
            return str(base / "bin" / name)
    return None


def resolve(step: Step, out: Path, cache: Path) -> tuple[list[str], dict[str, str]]:
    values = {"out": str(out), "cache": str(cache), "py": PY, "sanitizer": "{sanitizer}", "ncu": "{ncu}"}
    argv = [a.format(**values) for a in step.argv]
    env = {k: v.format(**values) for k, v in step.env}
    return argv, env


def _stop(proc: subprocess.Popen) -> None:
    """Stop the step's process group (it was started in a session of its own), politely first."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(run: Run, suite: str, step: Step, out: Path, limit: float) -> int:
    argv, env = resolve(step, out, run.cache)
    for placeholder, name in CUDA_TOOLS.items():
        if placeholder not in argv:
            continue
        found = _cuda_tool(name)
        if found is None:
            run.log(f"{suite}/{step.name}: {name} not found (PATH, /usr/local/cuda*/bin)")
            return 127
        argv = [found if a == placeholder else a for a in argv]
    for key in ("RAGDOT_CACHE_DIR",):
        if key in env:
            Path(env[key]).mkdir(parents=True, exist_ok=True)
    text = out / f"{step.name}.txt"
    run.log(f"{suite}/{step.name} (limit {limit:.0f} s): {' '.join(argv)}")
    start = time.monotonic()
    with open(text, "w") as f:
        proc = subprocess.Popen(argv, cwd=ROOT, env={**run.env, **env}, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc = 124
        except KeyboardInterrupt:
            _stop(proc)
            raise
    seconds = time.monotonic() - start
    if rc == 0 and step.after is not None:
        step.after(out, run.cache)
    lines = text.read_text(errors="replace").splitlines()[-step.tail:]
    run.note("\n".join(lines))
    run.log(f"{suite}/{step.name} rc={rc}{' (timed out)' if rc == 124 else ''} in {seconds:.0f} s")
    run.records.append({"suite": suite, "step": step.name, "argv": argv, "rc": rc, "seconds": round(seconds, 1),
                        "limit_s": round(limit, 1), "output": str(text.relative_to(run.out))})
    return rc


def run_suite(run: Run, name: str, budget: float | None) -> bool:
    suite = SUITES[name]
    out = run.out / name
    out.mkdir(parents=True, exist_ok=True)
    scale = (budget / suite.seconds) if budget else 1.0
    run.log(f"suite {name}: {suite.help} (budget {suite.seconds * scale:.0f} s)")
    ok = True
    for step in suite.steps:
        ok &= run_step(run, name, step, out, step.seconds * scale) == 0
    return ok


def _capture(argv: list[str], env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc.__class__.__name__})"
    return (done.stdout.strip() or done.stderr.strip()).splitlines()[-1:][0] if (done.stdout or done.stderr) else ""


def machine_lines(env: dict[str, str]) -> list[str]:
    lines = []
    if shutil.which("nvidia-smi"):
        lines.append(_capture(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,power.draw",
                               "--format=csv,noheader"]))
    probe = "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, " \
            "'cuda', torch.cuda.is_available())"
    lines.append(_capture([PY, "-c", probe], env))
    lines.append(f"python {sys.version.split()[0]}, commit {env.get('RAGDOT_COMMIT', 'unknown')}, "
                 f"{os.cpu_count()} CPUs")
    return lines


def _commit(given: str | None) -> str:
    if given:
        return given
    if os.environ.get("RAGDOT_COMMIT"):
        return os.environ["RAGDOT_COMMIT"]
    return _capture(["git", "rev-parse", "--short", "HEAD"]) or "unknown"


def _environment(commit: str, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(PYTHONUNBUFFERED="1", RAGDOT_COMMIT=commit, RAGDOT_CACHE_DIR=str(cache))
    return env


def pack(work: Path, dest: Path, run: Run) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest / "results.tgz", "w:gz") as tar:
        for path in sorted(work.iterdir()):
            if path.name != "cache":  # the tune cache is kept as <suite>/tune.json where it matters
                tar.add(path, arcname=path.name)
    for name in ("suite-log.txt", "suite-summary.json"):
        shutil.copy2(work / name, dest / name)


def gpu_names() -> list[str]:
    """The GPU nvidia-smi names (its last line: one machine's GPUs are alike; none without nvidia-smi or when it
    cannot run; where its query fails, the error line it printed, which names no GPU)."""
    if not shutil.which("nvidia-smi"):
        return []
    name = _capture(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).strip()
    return [name] if name and not name.startswith("unavailable (") else []


def _cuda_visible(env: dict[str, str]) -> bool:
    return _capture([PY, "-c", "import torch; print(torch.cuda.is_available())"], env) == "True"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        print(list_suites())
        return 0
    unknown = [s for s in args.suites if s not in SUITES]
    if not args.suites or unknown:
        what = f"unknown suite {unknown[0]!r}" if unknown else "name at least one suite"
        parser.exit(2, f"benchmarks/suite.py: error: {what} (one of: {', '.join(SUITES)}; --list shows them)\n")
    try:
        budgets = parse_seconds(args.seconds, args.suites)
    except ValueError as exc:
        parser.exit(2, f"benchmarks/suite.py: error: {exc}\n")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    dest = args.out or Path(os.environ.get("OUT") or f"out/suite-{stamp}")
    if dest.exists() and not dest.is_dir():
        parser.exit(2, f"benchmarks/suite.py: error: --out: {dest} is a file, not a folder\n")
    if args.dry_run:
        for name in args.suites:
            scale = budgets[name] / SUITES[name].seconds if name in budgets else 1.0
            for step in SUITES[name].steps:
                cmd, env = resolve(step, dest / name, dest / "cache")
                prefix = " ".join(f"{k}={v}" for k, v in env.items())
                print(f"{name}/{step.name} [{step.seconds * scale:.0f} s] {prefix + ' ' if prefix else ''}"
                      f"{' '.join(cmd)}")
        return 0
    if args.require_gpu:
        names = gpu_names()
        if not any(args.require_gpu.lower() in n.lower() for n in names):
            print(f"benchmarks/suite.py: the GPU is {', '.join(names) or 'none'}, not {args.require_gpu}: nothing run")
            return 3
    dest = dest.resolve()
    work = Path(tempfile.mkdtemp(prefix="ragdot-suite-")) if args.pack else dest
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    if cache.exists():
        shutil.rmtree(cache)  # a run starts from the shipped tune file only
    cache.mkdir()
    commit = _commit(args.commit)
    run = Run(work, cache, work / "suite-log.txt", _environment(commit, cache))
    for line in machine_lines(run.env):
        run.log(line)
    gpu = args.no_gpu_check or not any(SUITES[s].gpu for s in args.suites) or _cuda_visible(run.env)
    ok, interrupted = True, False
    try:
        for name in args.suites:
            if SUITES[name].gpu and not gpu:
                run.log(f"suite {name}: skipped: it needs a CUDA GPU and torch sees none (--no-gpu-check runs it)")
                ok = False
                continue
            ok &= run_suite(run, name, budgets.get(name))
    except KeyboardInterrupt:
        run.log("interrupted: the finished steps' results are kept")
        ok, interrupted = False, True
    run.log(f"done: {'every step passed' if ok else 'some steps FAILED or were skipped'}")
    (work / "suite-summary.json").write_text(json.dumps(
        {"commit": commit, "suites": args.suites, "date": stamp, "ok": ok, "steps": run.records}, indent=1))
    if args.pack:
        pack(work, dest, run)
        shutil.rmtree(work, ignore_errors=True)
        print(f"packed into {dest / 'results.tgz'}")
    return 130 if interrupted else (0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
