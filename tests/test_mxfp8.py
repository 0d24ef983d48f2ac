"""MXFP8 quantization and grouped weight gradient.

CPU: the torch quantizer against an independent float64 statement of the OCP rule, the Triton quantizer
(interpreter) bit for bit against the torch one, and the weight-gradient kernel's "upcast" and "promote" paths
through the interpreter (float32 MMA operands; the interpreter's bf16 dot is wrong) against the FP32 oracle.
GPU (`gpu` marker): every path in bf16 against the oracle, bitwise repeats, padding poisoned with NaN/0xFF.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from ragdot import mxfp8
from ragdot.mxfp8.reference import grouped_wgrad_reference, token_windows

qmod = importlib.import_module("ragdot.mxfp8.quantize")
wmod = importlib.import_module("ragdot.mxfp8.wgrad")

BF16_ULP = 2.0**-8  # bf16 output rounding, as a relative error bound (0.39%)
SMALL = wmod.WgradConfig(32, 32, 64, 4, 2)  # interpreter-sized tiles; BLOCK_T 64 > the 32-token alignment
SMALL_T128 = wmod.WgradConfig(32, 32, 128, 4, 2)


def _data(t: int, c: int, seed: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, c, generator=g) * torch.exp2(torch.randint(-6, 6, (1, c), generator=g).float())
    return x.to(dtype=dtype, device=device)


def _ocp_quantize_f64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The OCP MX rule written plainly in float64: scale 2^(floor(log2 amax) - 8), RNE, saturate to 448."""
    t, c = x.shape
    xb = x.double().reshape(t // 32, 32, c)
    amax = xb.abs().amax(dim=1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax)), torch.full_like(amax, -127.0)) - 8
    exp = exp.clamp(min=-127)
    v = (xb / torch.exp2(exp)[:, None, :]).clamp(-448, 448)
    q = v.float().to(torch.float8_e4m3fn)  # float64 -> float32 is exact here (|v| <= 448, 3 mantissa bits)
    return q.reshape(t, c), (exp + 127).to(torch.uint8)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# ---------------------------------------------------------------- quantization


def test_quantize_matches_ocp_rule_in_float64():
    x = _data(256, 96, seed=1)
    q, s = qmod.quantize_torch(x)
    q_ref, s_ref = _ocp_quantize_f64(x)
    assert torch.equal(s, s_ref)
    assert _same_bits(q, q_ref)


def test_quantize_layout_shapes_and_error_bound():
    x = _data(128, 64, seed=2)
    q, s = mxfp8.quantize(x, dim=0)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (128, 64) and q.stride() == (1, 128)
    assert s.dtype == torch.uint8 and s.shape == (4, 64)
    back = mxfp8.dequantize(q, s)
    assert back.dtype == torch.float32
    # elements of a block lose at most half an e4m3 step of the block's scale, or saturate at 448 * scale
    scale = qmod.e8m0_to_float(s).repeat_interleave(32, 0)
    err = (back - x).abs()
    ok = (err <= 2.0**-4 * x.abs() + 2.0**-10 * scale) | (back.abs() == 448 * scale)
    assert bool(ok.all())


def test_quantize_is_idempotent_and_dim1_is_the_transpose():
    x = _data(64, 96, seed=3)
    q, s = mxfp8.quantize(x)
    q2, s2 = mxfp8.quantize(mxfp8.dequantize(q, s))
    assert torch.equal(s, s2) and _same_bits(q, q2)
    q1, s1 = mxfp8.quantize(x.t().contiguous(), dim=1)
    assert s1.shape == (96, 2) and torch.equal(s1, s.t())
    assert _same_bits(q1, q.t())
    assert torch.equal(mxfp8.dequantize(q1, s1, dim=1), mxfp8.dequantize(q, s).t())


def test_quantize_special_blocks():
    x = _data(128, 8, seed=4)
    x[3, 0] = float("nan")
    x[40, 1] = float("inf")
    x[64:96, 2] = 0.0
    x[96:128, 3] = 1e-40  # float32 subnormals: the smallest scale, 2^-127
    x[0:32, 4] = 448.0 * 2.0**-3 * 1.06  # rounds past 448 after scaling: saturates
    q, s = qmod.quantize_torch(x)
    assert s[0, 0] == 255 and s[1, 1] == 255  # non-finite blocks get the NaN scale
    back = mxfp8.dequantize(q, s)
    assert torch.isnan(back[0:32, 0]).all() and torch.isnan(back[32:64, 1]).all()
    assert s[2, 2] == 0 and torch.equal(back[64:96, 2], torch.zeros(32))
    assert s[3, 3] == 0 and torch.allclose(back[96:128, 3], x[96:128, 3], rtol=2.0**-3, atol=0)
    assert back[0:32, 4].abs().max() == 448.0 * 2.0 ** (int(s[0, 4]) - 127)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_triton_kernel_bitwise_equals_torch(dtype):
    x = _data(192, 160, seed=5, dtype=dtype)  # 160 channels: a masked channel tile
    if dtype == torch.float32:
        x[0, 0] = float("nan")
        x[32:64, 1] = 1e-40
        x[64, 2] = -0.0
    q1, s1 = qmod.quantize_torch(x)
    q2, s2 = qmod.quantize_triton(x, block_t=64, block_c=64)
    assert torch.equal(s1, s2) and _same_bits(q1, q2)
    assert q2.stride() == (1, 192)


def test_dequantize_tokens_kernel_equals_torch():
    q, s = mxfp8.quantize(_data(160, 72, seed=6))
    s = s.clone()
    s[0, 0], s[1, 1] = 0, 255  # the smallest scale and the NaN scale
    out = qmod.dequantize_tokens_triton(q, s, torch.float32)
    assert out.stride() == (1, 160)
    assert torch.equal(out.nan_to_num(7.0), mxfp8.dequantize(q, s).nan_to_num(7.0))
    assert torch.isnan(out[32:64, 1]).all()


@pytest.mark.parametrize(
    "bad, exc, words",
    [
        (lambda: mxfp8.quantize(torch.zeros(48, 8)), ValueError, "multiple of 32"),
        (lambda: mxfp8.quantize(torch.zeros(32, 8), dim=2), ValueError, "dim"),
        (lambda: mxfp8.quantize(torch.zeros(32, 8, dtype=torch.int32)), TypeError, "float32"),
        (lambda: mxfp8.quantize(torch.zeros(32)), ValueError, "2-D"),
        (lambda: mxfp8.dequantize(torch.zeros(32, 8), torch.zeros(1, 8, dtype=torch.uint8)), TypeError, "q "),
        (lambda: mxfp8.dequantize(*mxfp8.quantize(torch.ones(64, 8))[:1], torch.zeros(1, 8, dtype=torch.uint8)),
         ValueError, "shape"),
    ],
)
def test_quantize_errors_name_the_argument(bad, exc, words):
    with pytest.raises(exc, match=words):
        bad()


# ---------------------------------------------------------------- weight gradient


def _operands(t: int, n: int, k: int, seed: int, device="cpu"):
    a_q, a_s = mxfp8.quantize(_data(t, n, seed, device=device))
    b_q, b_s = mxfp8.quantize(_data(t, k, seed + 100, device=device))
    return a_q, a_s, b_q, b_s


def _poison_tail(ops, start: int):
    """Write NaN data and 0xFF scales into every token at or past `start` (a multiple of 32)."""
    out = []
    for q, s in (ops[0:2], ops[2:4]):
        q = q.clone()
        s = s.clone()
        q.view(torch.uint8)[start:] = 0x7F
        s[start // 32:] = 255
        out += [q, s]
    return tuple(out)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def _run(ops, sizes, path="upcast", cfg=SMALL, out_dtype=torch.float32, order="auto"):
    return wmod.grouped_wgrad_triton(*ops, sizes, out_dtype=out_dtype, path=path, config=cfg, order=order)


@pytest.mark.parametrize("path", ["upcast", "promote"])
def test_wgrad_kernel_matches_oracle_with_poisoned_tail(path):
    t, n, k = 384, 48, 40  # N, K not multiples of the 32-wide tiles: masked edges
    sizes = torch.tensor([96, 0, 160, 32], dtype=torch.int32)  # empty expert; 32- but not 64-aligned ends
    ops = _poison_tail(_operands(t, n, k, seed=7), start=288)
    ref = grouped_wgrad_reference(*ops, sizes, out_dtype=torch.float32)
    out = _run(ops, sizes, path=path)
    assert torch.isfinite(out).all()
    assert _rel_err(out, ref) < 1e-5
    assert torch.equal(out[1], torch.zeros(n, k))  # the empty expert: an exact-zero slab
    bf = _run(ops, sizes, path=path, out_dtype=torch.bfloat16)
    assert bf.dtype == torch.bfloat16
    assert _rel_err(bf, ref) <= BF16_ULP  # (the interpreter narrows by truncation; the GPU test checks RNE)


def test_wgrad_repeats_bitwise_and_equals_the_copy_based_path():
    t, n, k = 448, 40, 64
    sizes = torch.tensor([64, 96, 32, 128], dtype=torch.int32)  # sum 320: 128 tokens of padding
    ops = _poison_tail(_operands(t, n, k, seed=8), start=320)
    out1 = _run(ops, sizes, cfg=SMALL_T128)
    out2 = _run(ops, sizes, cfg=SMALL_T128)
    assert torch.equal(out1, out2)
    # the same tokens copied to their exact width (no padding, different buffers and offsets)
    exact = tuple(x[:320].clone() if i % 2 == 0 else x[:10].clone() for i, x in enumerate(ops))
    out3 = _run(exact, sizes, cfg=SMALL_T128)
    assert torch.equal(out1, out3)
    # and group by group, each expert's tokens alone
    for g, (start, end) in enumerate(token_windows(sizes, 320)):
        alone = (ops[0][start:end], ops[1][start // 32:end // 32], ops[2][start:end], ops[3][start // 32:end // 32])
        one = _run(alone, torch.tensor([end - start], dtype=torch.int32), cfg=SMALL_T128)
        assert torch.equal(one[0], out1[g])


def test_dequant_gmm_path_matches_oracle_with_poisoned_tail():
    # exact bf16 dequantization (interpreter) + torch._grouped_mm (its CPU kernel here)
    t, n, k = 384, 48, 40
    sizes = torch.tensor([96, 0, 160, 32], dtype=torch.int32)
    ops = _poison_tail(_operands(t, n, k, seed=14), start=288)
    ref = grouped_wgrad_reference(*ops, sizes, out_dtype=torch.float32)
    out = wmod.grouped_wgrad_triton(*ops, sizes, path="dequant-gmm")
    assert out.dtype == torch.bfloat16 and out.shape == (4, n, k) and torch.isfinite(out).all()
    assert _rel_err(out, ref) <= BF16_ULP
    assert torch.equal(out[1], torch.zeros(n, k, dtype=torch.bfloat16))
    exact = tuple(x[:288].clone() if i % 2 == 0 else x[:9].clone() for i, x in enumerate(ops))
    assert torch.equal(out, wmod.grouped_wgrad_triton(*exact, sizes, path="dequant-gmm"))


def test_wgrad_block_order_does_not_change_bits():
    sizes = torch.tensor([32, 192, 0, 96, 64], dtype=torch.int32)
    ops = _operands(416, 32, 32, seed=9)
    natural = _run(ops, sizes, order="natural")
    longest = _run(ops, sizes, order="longest")
    assert torch.equal(natural, longest)


def test_wgrad_nan_scale_inside_a_group_propagates_only_there():
    sizes = torch.tensor([64, 64], dtype=torch.int32)
    ops = list(_operands(128, 32, 32, seed=10))
    ops[1] = ops[1].clone()
    ops[1][2, 5] = 255  # block 2 (tokens 64..95, expert 1), channel 5 of a
    out = _run(tuple(ops), sizes)
    assert torch.isfinite(out[0]).all()
    assert torch.isnan(out[1, 5]).all() and torch.isfinite(out[1, :5]).all()


def test_wgrad_sizes_off_the_contract_stay_in_bounds_and_follow_the_block_rule():
    ops = _operands(256, 32, 32, seed=11)
    sizes = torch.tensor([40, -5, 1000], dtype=torch.int32)  # not multiples of 32, negative, past T
    out = _run(ops, sizes)
    ref = grouped_wgrad_reference(*ops, sizes, out_dtype=torch.float32)
    assert token_windows(sizes, 256) == [(0, 64), (64, 64), (64, 256)]
    assert _rel_err(out, ref) < 1e-5 and torch.equal(out[1], torch.zeros(32, 32))


def test_grouped_wgrad_public_cpu_path_and_validation():
    ops = _operands(128, 16, 24, seed=12)
    sizes = torch.tensor([32, 64], dtype=torch.int64)
    dw = mxfp8.grouped_wgrad(*ops, sizes)
    assert dw.shape == (2, 16, 24) and dw.dtype == torch.bfloat16
    assert torch.equal(dw, grouped_wgrad_reference(*ops, sizes))
    with pytest.raises(ValueError, match=r"group_sizes\[1\]=48"):
        mxfp8.grouped_wgrad(*ops, torch.tensor([32, 48]), validate=True)
    with pytest.raises(ValueError, match="exceeds"):
        mxfp8.grouped_wgrad(*ops, torch.tensor([64, 96]), validate=True)
    with pytest.raises(TypeError, match="a_q"):
        mxfp8.grouped_wgrad(ops[0].float(), *ops[1:], sizes)
    with pytest.raises(ValueError, match="b_s"):
        mxfp8.grouped_wgrad(*ops[:3], ops[3][:2], sizes)
    with pytest.raises(ValueError, match="tokens"):
        mxfp8.grouped_wgrad(*ops[:2], ops[2][:96], ops[3][:3], sizes)
    with pytest.raises(TypeError, match="out_dtype"):
        mxfp8.grouped_wgrad(*ops, sizes, out_dtype=torch.int8)
    with pytest.raises(TypeError, match="group_sizes"):
        mxfp8.grouped_wgrad(*ops, sizes.float())


def test_wgrad_config_and_path_errors():
    with pytest.raises(ValueError, match="block_t"):
        wmod.WgradConfig(block_t=48)
    ops = _operands(64, 16, 16, seed=13)
    with pytest.raises(ValueError, match="path"):
        _run(ops, torch.tensor([64]), path="nope")
    with pytest.raises(ValueError, match="order"):
        _run(ops, torch.tensor([64]), order="random")


# ---------------------------------------------------------------- benchmark


def test_bench_routings_are_the_seeds():
    from ragdot.bench.mxfp8 import SHAPES
    from ragdot.bench.mxfp8_cases import routing_sizes

    _, _, experts, tokens = SHAPES["671B-4096"]
    aligned = routing_sizes(tokens, experts, "aligned")
    shifted = routing_sizes(tokens, experts, "shifted")
    assert sum(aligned) == sum(shifted) == tokens
    assert all(s % 256 == 0 for s in aligned)
    assert abs(max(aligned) / (tokens / experts) - 1.5) < 0.05
    ends = [sum(shifted[: i + 1]) for i in range(experts - 1)]
    assert all(e % 32 == 0 and e % 128 for e in ends)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke run through the interpreter (CI)")
def test_bench_cli_smoke_on_the_cpu(tmp_path):
    import csv

    from ragdot.cli import main

    rc = main(["bench-mxfp8", "--device", "cpu", "--shapes", "tiny", "--variants", "upcast-128x128w4",
               "--routings", "shifted", "--passes", "1", "--seconds", "0", "--no-baselines", "--out", str(tmp_path)])
    assert rc == 0
    (path,) = tmp_path.glob("mxfp8-bench-*.csv")  # a new file per run, named by GPU and date
    rows = list(csv.DictReader(path.read_text().splitlines()))
    mx = [r for r in rows if r["variant"] == "mx-upcast-128x128w4"]
    assert len(mx) == 1 and float(mx[0]["ms"]) > 0
    assert float(mx[0]["err"]) <= 2.0**-7  # the interpreter narrows to bf16 by truncation: 2 ulp bound
    assert {r["variant"] for r in rows} >= {"quantize dY", "quantize X"}


# ---------------------------------------------------------------- GPU


GPU_PATHS = ["upcast", "upcast-bits", "promote", "scaled", "dequant-gmm"]


@pytest.mark.gpu
def test_gpu_quantize_bitwise_equals_torch():
    x = _data(4096, 1536, seed=20, dtype=torch.bfloat16, device="cuda")
    x[5, 7] = float("nan")
    x[64:96, 9] = 1e-39
    q1, s1 = qmod.quantize_torch(x)
    q2, s2 = mxfp8.quantize(x)
    assert torch.equal(s1, s2) and _same_bits(q1, q2)


@pytest.mark.gpu
@pytest.mark.parametrize("path", GPU_PATHS)
def test_gpu_wgrad_paths(path):
    t, n, k = 6144, 384, 640
    sizes = torch.tensor([1024, 0, 2080, 32, 1504], dtype=torch.int32, device="cuda")  # sum 4640
    ops = _poison_tail(_operands(t, n, k, seed=21, device="cuda"), start=4640)
    ref = grouped_wgrad_reference(*ops, sizes, out_dtype=torch.float32)
    out = wmod.grouped_wgrad_triton(*ops, sizes, path=path)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert _rel_err(out, ref) <= BF16_ULP
    if path != "promote":  # measured on the H200: fp8 MMA sums each 32-token block with reduced precision
        elementwise = (out.float() - ref).abs() <= BF16_ULP * ref.abs() + 1e-6 * ref.abs().max()
        assert bool(elementwise.all())
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(out, wmod.grouped_wgrad_triton(*ops, sizes, path=path))
    if path != "dequant-gmm":  # (the vendor GEMM may pick another kernel for a float32 output)
        out32 = wmod.grouped_wgrad_triton(*ops, sizes, path=path, out_dtype=torch.float32)
        assert torch.equal(out, out32.to(torch.bfloat16))  # rounded once, to nearest even, in the register
    exact = tuple(x[:4640].clone() if i % 2 == 0 else x[:145].clone() for i, x in enumerate(ops))
    assert torch.equal(out, wmod.grouped_wgrad_triton(*exact, sizes, path=path))
    assert torch.equal(out, wmod.grouped_wgrad_triton(*ops, sizes, path=path, order="natural"))


@pytest.mark.gpu
def test_gpu_public_wgrad_and_nan_data_inside_a_group():
    ops = list(_operands(1024, 256, 256, seed=22, device="cuda"))
    sizes = torch.tensor([512, 512], dtype=torch.int32, device="cuda")
    dw = mxfp8.grouped_wgrad(*ops, sizes)
    assert _rel_err(dw, grouped_wgrad_reference(*ops, sizes, out_dtype=torch.float32)) <= BF16_ULP
    ops[0] = ops[0].clone()
    ops[0].view(torch.uint8)[600, 3] = 0x7F  # NaN element of expert 1, channel 3 of a (finite scale)
    dw = wmod.grouped_wgrad_triton(*ops, sizes, path="upcast")
    assert torch.isnan(dw[1, 3]).all() and torch.isfinite(dw[0]).all() and torch.isfinite(dw[1, 4:]).all()
    assert not math.isnan(_rel_err(dw[0], grouped_wgrad_reference(*ops, sizes, out_dtype=torch.float32)[0]))
