"""Run records: the metadata of a run (GPU, commit, date, versions) and its CSV and JSON files.

Every benchmark writes new files per run (`new_stem`: ``<prefix>-<date>``, ``_2`` ... on a clash, claimed
exclusively), so an earlier run is never overwritten. A JSON file holds ``{"meta": ..., "rows": [...]}``
(plus ``"columns"`` where the caller names them); it is replaced whole, never left half written.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ragdot.cli_common import new_stem, safe_name

__all__ = ["commit", "gpu_name", "triton_version", "run_meta", "write_csv", "write_json", "write_document", "RowWriter",
           "new_stem", "safe_name"]  # fmt: skip

Row = Mapping[str, Any]


def commit() -> str:
    """$RAGDOT_COMMIT, else ``git rev-parse --short HEAD`` of the source tree, else "unknown"."""
    if os.environ.get("RAGDOT_COMMIT"):
        return os.environ["RAGDOT_COMMIT"]
    try:
        here = Path(__file__).resolve().parent
        cmd = ["git", "rev-parse", "--short", "HEAD"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=here)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def gpu_name(device: Any = None) -> str:
    """The CUDA device's name, "cpu" for a CPU device (or, with no device given, when CUDA is absent)."""
    import torch

    if device is None:
        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def run_meta(device: Any, dtype: Any = None, *, with_triton: bool = False, commit_id: str | None = None) -> dict:
    """gpu, commit, date (ISO, seconds), torch (and triton) versions, and dtype ("bfloat16") when given."""
    import torch

    meta: dict[str, Any] = {
        "gpu": gpu_name(device),
        "commit": commit_id or commit(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__,
    }
    if with_triton:
        meta["triton"] = triton_version()
    if dtype is not None:
        meta["dtype"] = str(dtype).removeprefix("torch.")
    return meta


def write_csv(rows: Sequence[Row], path: Path, columns: Sequence[str] | None = None) -> Path:
    """`rows` under a header of `columns` (default: every key of the rows, in first-seen order; keys of a
    row that are not columns are left out)."""
    keys = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_json(
    path: Path, meta: Row, rows: Sequence[Row], columns: Sequence[str] | None = None, newline: bool = False
) -> Path:
    """``{"meta", ["columns",] "rows"}``, indented, replacing `path` whole (values JSON lacks become str)."""
    doc: dict[str, Any] = {"meta": meta}
    if columns is not None:
        doc["columns"] = list(columns)
    doc["rows"] = list(rows)
    return write_document(path, doc, newline=newline)


def write_document(path: Path, doc: Any, indent: int | None = 1, newline: bool = False) -> Path:
    """`doc` as JSON, replacing `path` whole (values JSON lacks become str)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=indent, default=str) + ("\n" if newline else ""))
    tmp.replace(path)  # whole or not at all, even when interrupted
    return path


class RowWriter:
    """The CSV and JSON of one run in new files ``<prefix>-<date>``; rows are written as they finish.

    With `columns`, each row is appended to the CSV under that header; without, the CSV is rewritten whole on
    every row, its header every key seen so far. `rewrite()` writes both files anew after rows were changed in
    place (e.g. speed ratios that a later row made known)."""

    def __init__(self, out: Path, prefix: str, meta: Row, columns: Sequence[str] | None = None) -> None:
        name = new_stem(out, prefix)
        self.csv, self.json = out / f"{name}.csv", out / f"{name}.json"
        self.columns = None if columns is None else tuple(columns)
        self.meta, self.rows = meta, []
        self.rewrite()

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.columns is None:
            self.rewrite()
            return
        with open(self.csv, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore").writerow(row)
        write_json(self.json, self.meta, self.rows)

    def rewrite(self) -> None:
        if self.columns is not None or self.rows:
            tmp = self.csv.with_suffix(".csv.tmp")
            write_csv(self.rows, tmp, self.columns).replace(self.csv)  # whole or not at all
        write_json(self.json, self.meta, self.rows)

    @property
    def files(self) -> list[Path]:
        return [self.csv, self.json]
