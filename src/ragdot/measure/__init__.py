"""Measurement: the one place for timing, correctness checks and run records.

Modules: `timing` (the clocks: eager calls and CUDA-graph replays under CUDA events, the wall clock on a CPU;
host time per call, interleaving of several systems, L2 rotation, time budgets; single-call helpers),
`host` (host time per call of back-to-back calls, and their eager and device time on CUDA), `checks` (the
normalised error against a reference and the tolerance per dtype), `records` (run metadata and CSV/JSON
files that never overwrite an earlier run).

Nothing here needs numpy, rich or matplotlib. The package imports no submodule (nor torch) by itself:
import the one needed, e.g. ``from ragdot.measure.timing import measure``.
"""
