"""Compile (for sm_90, on any machine: Triton's bundled ptxas) the Gluon and the Triton ragged-M kernels with
the same 128x256x64 three-stage tile at mixtral-8x7b fwd_wi's shape, and print each one's register budget,
shared memory and the SASS of its main loop (from the first HGMMA of the K step to the stage release).

    PYTHONPATH=src python benchmarks/results/h200-night-20261201/probes/sass_compare.py
"""

import os
import subprocess

import torch
import triton

from ragdot.kernels.configs import TileConfig, compile_only
from ragdot.kernels.gluon.config import GluonConfig
from ragdot.kernels.gluon.ragged_m import Prepared as GluonPrepared
from ragdot.kernels.ragged_m import Prepared as TritonPrepared

M, K, N, G = 15360, 6144, 20480, 32  # mixtral-8x7b fwd_wi
bf = torch.bfloat16
a, b, sizes = torch.empty(1, M, K, dtype=bf), torch.empty(1, G, K, N, dtype=bf), torch.zeros(G, dtype=torch.int32)
with compile_only(90):
    kernels = {
        "gluon 128x256x64 s3 w8": GluonPrepared(a, b, bf, GluonConfig(128, 256, 64, 3, 8), from_sizes=True)(a, b, sizes)[1],
        "triton 128x256x64 s3 w8 flat": TritonPrepared(
            a, b, bf, TileConfig(128, 256, 64, 8, 8, 3, True, 1, tma=True, flat=True), from_sizes=True)(a, b, sizes)[1],
    }
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
for name, kernel in kernels.items():
    path = f"/tmp/{name.split()[0]}.cubin"
    with open(path, "wb") as f:
        f.write(kernel.asm["cubin"])
    sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, check=True).stdout
    elf = subprocess.run([cuobjdump, "-elf", path], capture_output=True, text=True, check=True).stdout
    regs = [ln.split("register count:")[1].strip() for ln in elf.splitlines() if "register count:" in ln]
    code = [ln.split("*/", 1)[1].split("/*")[0].strip() for ln in sass.splitlines() if ln.strip().startswith("/*")
            and "*/" in ln]
    code = [c for c in code if c]
    first = next(i for i, c in enumerate(code) if "HGMMA" in c)
    last = next(i for i in range(first, len(code)) if "SYNCS.ARRIVE" in code[i])
    print(f"== {name}: {regs[0]} registers a thread, {kernel.metadata.shared} bytes of shared memory, "
          f"{kernel.metadata.num_warps} warps")
    for c in code[first - 2:last + 2]:
        print("   ", c)
