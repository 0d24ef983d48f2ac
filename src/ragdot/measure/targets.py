"""Reference numbers a run may be compared against, read from a JSON file named on the command line.

The package holds no such numbers. A targets file (``--targets FILE``; the suite passes
``benchmarks/targets-h200.json``) is one JSON object; each section is read by the command it names and
is optional:

- ``gpu``: the text the device name must contain for the numbers to apply (e.g. ``"H200"``);
- ``ceilings``: ``bf16_tflops``, ``hbm_gbs`` (and more): measured ceilings of that GPU;
- ``bench``: ``anchors`` (``ragdot bench``: TFLOP/s of ``vendor``/``torch`` per shape, routing and pass);
- ``moe-bench``: the train-step goals of ``ragdot moe-bench`` (speed ratios, routing share, memory).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ragdot.cli_common import UsageError

__all__ = ["load_targets", "applies", "section"]


def load_targets(path: Path | str | None, flag: str = "--targets") -> dict[str, Any]:
    """The targets file's object ({} for None); UsageError naming `flag` when it cannot be read."""
    if path is None:
        return {}
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{flag} {path}: not a JSON file ({exc})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{flag} {path}: expected a JSON object with sections such as 'bench' or 'moe-bench'")
    return doc


def applies(targets: dict[str, Any], gpu: str) -> bool:
    """Whether the file's numbers are for this device (its ``gpu`` text in the device name)."""
    want = targets.get("gpu")
    return bool(targets) and (not want or str(want) in gpu)


def section(targets: dict[str, Any], name: str, gpu: str) -> dict[str, Any]:
    """The file's section `name` where it applies to `gpu`, else {}."""
    value = targets.get(name) if applies(targets, gpu) else None
    return value if isinstance(value, dict) else {}
