"""The README's usage example runs as written (on this machine's device, at smaller sizes)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parent.parent / "README.md"
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _usage_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no python example"
    return blocks[0]


def test_the_usage_example_runs_and_gives_what_its_comments_say():
    code = _usage_example()
    # the example's sizes (M=4096, K=2048, N=1408, G=64) shrunk, its device this machine's
    for old, new in (("4096", "@M"), ("2048", "@K"), ("1408", "@N"), ("64", "8"), ("@M", "96"), ("@K", "32"),
                     ("@N", "24"), ('device="cuda"', "device=DEV")):
        assert old in code, old
        code = code.replace(old, new)
    scope: dict = {"DEV": DEV}
    exec(compile(code, str(README), "exec"), scope)  # noqa: S102 - the README's own example
    tokens, w_up, group_sizes, h, dw = (scope[k] for k in ("tokens", "w_up", "group_sizes", "h", "dw"))
    assert tokens.shape == (96, 32) and w_up.shape == (8, 32, 24) and group_sizes.shape == (8,)
    assert h.shape == (96, 24) and dw.shape == (8, 32, 24)
    import ragdot

    assert torch.equal(h, ragdot.ragged_dot(tokens, w_up, group_sizes))  # grouped_mm's h = ragged_dot's
    assert isinstance(ragdot.explain(tokens, w_up, group_sizes)["plan"][0], tuple)
