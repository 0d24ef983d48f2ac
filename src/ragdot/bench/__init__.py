"""Benchmarks of ragdot: `ragdot bench`, the micro-benchmark of the six ragged-dot classes.

Modules: `classes` (the six classes, FLOP and byte counts), `systems` (what is timed: ragdot backends,
`auto`, `vendor` (raw torch._grouped_mm, the baseline of every ratio), any function), `xla`
(jax.lax.ragged_dot_general on the same device), `runner` (one cell: fresh inputs, check against the
reference backend, timing on every clock, with the clocks, checks and records of `ragdot.measure`), `ceilings` (measured
matmul peak and copy bandwidth), `plan` (the time estimate printed before a run), `report` (CSV, JSON,
rich tables), `summary` (markdown and plots with the clock views side by side, also for committed CSVs),
`plots` (the run's PNGs), `cli` (the subcommand).
"""
