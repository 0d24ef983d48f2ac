"""Benchmarks of ragdot: every benchmark subcommand, beside the library packages, never inside them.

`ragdot bench`, the micro-benchmark of the six ragged-dot classes: `systems` (what is timed: ragdot
backends, `auto`, `vendor` (raw torch._grouped_mm, the baseline of every ratio), any function), `xla`
(jax.lax.ragged_dot_general on the same device), `runner` (one cell: fresh inputs, check against the
reference backend, timing on every clock, with the clocks, checks and records of `ragdot.measure`),
`ceilings` (measured matmul peak and copy bandwidth, flagged when measured on a busy machine), `plan` (the
time estimate printed before a run), `report` (CSV, JSON, rich tables, the check against a targets file's
anchors), `summary` (markdown and plots with the clock views side by side, also for committed CSVs), `plots`
(the run's PNGs), `cli` (the subcommand); `classes` re-exports `ragdot.measure.classes`.
`ragdot host-bench`: `host`. `ragdot moe-bench`: `moe` (the subcommand), `moe_train` (train steps of a
config's variants), `moe_routing` (``--routing-only``), `moe_report` (ratios, table, target checks, figures),
`moe_layer` (``--layer``). `ragdot bench-mxfp8`: `mxfp8` (the subcommand), `mxfp8_cases` (the kernel
variants and one shape's interleaved run).
"""
