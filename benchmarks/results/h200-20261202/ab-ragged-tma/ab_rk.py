"""A/B of the Gluon ragged_k (weight gradient) kernel: the committed one before the ragged TMA views (old_rk.py,
edge rows zeroed in shared memory by the consumer) against the working tree's, same configs, graph clock,
interleaved, every anchor wgrad cell on three routings; the two results compared bitwise."""
import json, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent)); sys.path.insert(0, "benchmarks")
import old_rk
from gluon_gpu import cell_operands, _shapes
from ragdot.kernels.gluon import ragged_k as new_rk
from ragdot.kernels.gluon.config import GluonConfig
from ragdot.measure.timing import GRAPH, EAGER, Timed, measure_clocks
from ragdot.routing import group_sizes
from ragdot.tune.key import key_for
from ragdot.tune.select import tuned_entry

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
dev = torch.device("cuda")
PP = GluonConfig(block_m=128, block_n=128, block_k=64, stages=5, num_warps=4, consumers=2)
rows = []
t0 = time.time()
for shape in _shapes():
    name, m, k, n, e = shape
    for cls in ("wgrad_wi", "wgrad_wo"):
        ops = cell_operands(cls, m, k, n, e, torch.Generator(device=dev).manual_seed(0))
        _, a, b, mat_a, mat_b = ops
        entry = tuned_entry(key_for("ragged_k", a, b, e, a.dtype)) or {}
        data = entry.get("configs", {}).get("gluon")
        cfgs = [GluonConfig(**data)] if data else [None]
        if PP not in cfgs:
            cfgs.append(PP)
        for routing in ("balanced", "skewed", "empty"):
            sizes = group_sizes(routing, m, e, device=dev)
            ends = torch.cumsum(sizes, 0, dtype=torch.int32)
            systems, outs = [Timed("vendor", [lambda: torch._grouped_mm(mat_a, mat_b, offs=torch.cumsum(sizes, 0, dtype=torch.int32))])], {}
            for cfg in cfgs:
                for tag, mod in (("old", old_rk), ("new", new_rk)):
                    try:
                        p = mod.Prepared(a, b, e, a.dtype, cfg)
                    except NotImplementedError as exc:
                        print(name, cls, tag, exc); continue
                    label = f"{tag}:{p.cfg.short()}"
                    fn = (lambda p=p: p(a, b, ends)[0])
                    outs[label] = fn()
                    systems.append(Timed(label, [fn]))
            ref = systems[0].calls[0]().reshape(e, a.shape[2], b.shape[2])
            torch.cuda.synchronize()
            t = measure_clocks(systems, dev, clocks=(GRAPH,), warmup=3, iters=30, max_seconds=0.2)
            v = t[("vendor", GRAPH)].median
            for s in systems:
                ms = t[(s.name, GRAPH)].median
                row = dict(shape=name, cls=cls, routing=routing, system=s.name, graph_ms=ms, x_vendor=v / ms)
                if s.name != "vendor":
                    o = outs[s.name].reshape(ref.shape)
                    row["max_err_vs_vendor"] = float((o.float() - ref.float()).abs().max())
                    twin = ("new" if s.name.startswith("old") else "old") + s.name[3:]
                    if twin in outs:
                        row["bitwise_vs_twin"] = bool(torch.equal(outs[twin], outs[s.name]))
                    row["finite"] = bool(torch.isfinite(o).all())
                rows.append(row)
            (out / "ab_rk.json").write_text(json.dumps(rows, indent=1))
            print(f"{time.time()-t0:6.1f}s {name:24s} {cls} {routing:8s} " + "  ".join(
                f"{r['system']}={r['graph_ms']:.3f}" for r in rows[-len(systems):]), flush=True)
(out / "ab_rk.json").write_text(json.dumps(rows, indent=1))
