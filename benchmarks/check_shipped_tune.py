"""Does a fresh process find a shipped tuning entry for every anchor cell? (run on the GPU the file is for)

For each anchor shape and class it builds the call's operands (uninitialised, no kernel runs) and asks
`ragdot.explain` what `auto` would run and whether a measured entry chose it. Exit status 1 if any cell has
no entry. Point RAGDOT_CACHE_DIR at an empty directory so that only the shipped file can answer (the `verify`
suite of benchmarks/suite.py does).
"""

from __future__ import annotations

import sys

import torch

import ragdot
from ragdot.measure.classes import CLASS_NAMES, parse_classes
from ragdot.shapes import shapes_with_tag


def main() -> int:
    missing = 0
    for shape in shapes_with_tag("anchor"):
        for cls in parse_classes(list(CLASS_NAMES)):
            lshape, rshape, _ = cls.shapes(shape)
            lhs = torch.empty(lshape, device="cuda", dtype=torch.bfloat16)
            rhs = torch.empty(rshape, device="cuda", dtype=torch.bfloat16)
            sizes = torch.full((shape.E,), shape.M // shape.E, device="cuda", dtype=torch.int32)
            info = ragdot.explain(lhs, rhs, sizes, cls.ragdot_dimension_numbers())
            name, cfg = info["plan"][0]
            missing += not info["tuned"]
            print(f"{shape.name:18s} {cls.name:8s} {'tuned' if info['tuned'] else 'NO ENTRY':8s} "
                  f"{name}{':' + cfg.short() if cfg else ''}")
            del lhs, rhs
    print(f"{missing} cells without a shipped entry")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
