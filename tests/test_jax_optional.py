"""Without jax, ragdot imports and runs as before and `ragdot.jax` says what to install."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

BLOCK_JAX = textwrap.dedent(
    """
    import sys

    class _NoJax:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("jax", "jaxlib"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoJax())
    """
)

PROBE = textwrap.dedent(
    """
    import torch, ragdot
    out = ragdot.ragged_dot(torch.ones(4, 3), torch.ones(2, 3, 5), torch.tensor([1, 2]))
    assert out[:3].eq(3).all() and out[3].eq(0).all()
    try:
        import ragdot.jax
    except ImportError as exc:
        print("refused:", exc)
    """
)


def test_ragdot_without_jax(tmp_path: Path):
    (tmp_path / "sitecustomize.py").write_text(BLOCK_JAX)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "refused: ragdot.jax needs jax" in res.stdout and "ragdot[jax]" in res.stdout


BLOCK_TRITON = BLOCK_JAX.replace('("jax", "jaxlib")', '("triton",)').replace("_NoJax", "_NoTriton")

PROBE_NO_TRITON = textwrap.dedent(
    """
    import numpy as np, jax, jax.numpy as jnp
    import ragdot, ragdot.jax as rj
    assert "triton" not in ragdot.backends()
    out = jax.jit(rj.ragged_dot)(jnp.ones((4, 3)), jnp.ones((2, 3, 5)), jnp.asarray([1, 2], jnp.int32))
    assert np.asarray(out)[:3].tolist() == [[3.0] * 5] * 3 and not np.asarray(out)[3].any()
    print("ran")
    """
)


def test_ragdot_jax_without_triton(tmp_path: Path):
    """ragdot.jax needs jax, not Triton: without it the calls run on the torch / reference backends."""
    (tmp_path / "sitecustomize.py").write_text(BLOCK_TRITON)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]), "JAX_PLATFORMS": "cpu"}
    env.pop("TRITON_INTERPRET", None)
    res = subprocess.run([sys.executable, "-c", PROBE_NO_TRITON], capture_output=True, text=True, env=env,
                         timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "ran" in res.stdout
