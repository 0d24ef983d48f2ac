"""Benchmarks of ragdot: `ragdot bench`, the micro-benchmark of the six ragged-dot classes.

Modules: `classes` (the six classes, FLOP and byte counts), `systems` (what is timed: ragdot backends,
`auto`, any function), `xla` (jax.lax.ragged_dot_general on the same device), `runner` (one cell: fresh
inputs, check against the reference backend, timing), `timing` (CUDA events or graphs, wall clock,
interleaving, L2 rotation, time budget), `ceilings` (measured matmul peak and copy bandwidth), `plan` (the
time estimate printed before a run), `report` (CSV, JSON, rich tables), `plots` (PNGs), `cli` (the
subcommand).
"""
