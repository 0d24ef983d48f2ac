"""Measurement: the one place for timing, correctness checks and run records.

Modules: `timing` (the clocks: eager calls and CUDA-graph replays under CUDA events, the wall clock on a CPU;
host time per call, interleaving of several systems, L2 rotation, time budgets; single-call helpers),
`host` (host time per call of back-to-back calls, and their eager and device time on CUDA), `checks` (the
normalised error against a reference and the tolerance per dtype), `records` (run metadata and CSV/JSON
files that never overwrite an earlier run, rows written as they finish), `classes` (the six ragged-dot
classes of an MoE expert block, their FLOP and byte counts), `progress` (progress lines with the time left,
a run budget, rows kept on Ctrl-C), `targets` (reference numbers read from a ``--targets`` file) and
`console` (terminal tables and progress: rich where installed, plain text where not).

Nothing here needs numpy, rich or matplotlib. The package imports no submodule (nor torch) by itself:
import the one needed, e.g. ``from ragdot.measure.timing import measure``.
"""
