"""The benchmarks run without their optional dependencies (rich, matplotlib): plain text, no plots, exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

BLOCKER = textwrap.dedent(
    """
    import sys

    class _Missing:
        names = ("rich", "matplotlib")

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.names:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _Missing())
    """
)


def test_bench_quick_without_rich_and_matplotlib_writes_its_results(tmp_path: Path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), *sys.path])}
    env.pop("TRITON_INTERPRET", None)
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "ragdot", "bench", "--quick", "--no-xla", "--device", "cpu",
                          "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "rich is not installed" in res.stdout
    assert "Traceback" not in res.stderr
    assert len(list(out.glob("*.csv"))) == 1 and len(list(out.glob("*.json"))) == 1
    assert not list(out.glob("*.png"))
