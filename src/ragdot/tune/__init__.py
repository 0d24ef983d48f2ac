"""Autotuning and measured backend selection (`backend=None` / `"auto"`).

`ragdot tune` measures every candidate (the vendor grouped GEMM and Triton tile configs) on seeded group
sizes and stores the winners in a JSON cache keyed by device, dtype, canonical problem, static sizes and the
bucketed token count; results for known GPUs ship inside the package.
"""
