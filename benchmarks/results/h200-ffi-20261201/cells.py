"""The per-cell tables of cells.md from this folder's runs: python cells.py > cells.md"""
import csv, glob, json, math, os

HERE = os.path.dirname(os.path.abspath(__file__))
geo = lambda v: math.exp(sum(map(math.log, v)) / len(v))
rows = []
for f in sorted(glob.glob(os.path.join(HERE, "jax-7584d9d-ffi/device/bench/*.csv"))):
    rows += list(csv.DictReader(open(f)))
t = {(r["shape"], r["cls"], r["backend"], r["clock"]): float(r["ms"]) * 1e3 for r in rows if r["ms"]}
kern = {(r["shape"], r["cls"]): r for r in json.load(open(os.path.join(HERE, "kernels-568a731/jax_cell_probe.json")))}
dev = lambda k: sum(n * us for name, (n, us) in k.items() if not name.startswith(("ragdot::", "aten::"))) / 10
print("| shape | class | triton graph µs | ragdot-jax program µs | ratio | triton eager µs | ragdot-jax batch µs | ratio "
      "| triton kernels µs | ragdot-jax kernels µs | ratio |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
prog, eag, ker = [], [], []
for s, c in sorted({(s, c) for s, c, _, _ in t}):
    tg, jp, te, jb = t[s, c, "triton", "graph"], t[s, c, "ragdot-jax", "program"], t[s, c, "triton", "eager"], \
        t[s, c, "ragdot-jax", "batch"]
    k = kern[s, c]
    tk, jk = dev(k["triton_kernels"]), dev(k["ragdot-jax_kernels"])
    prog.append(tg / jp), eag.append(te / jb), ker.append(tk / jk)
    print(f"| {s} | {c} | {tg:.1f} | {jp:.1f} | {tg / jp:.3f} | {te:.1f} | {jb:.1f} | {te / jb:.3f} | {tk:.1f} | {jk:.1f} "
          f"| {tk / jk:.3f} |")
for name, v in (("program / graph", prog), ("batch / eager", eag), ("kernels / kernels", ker)):
    print(f"\n{name}: geomean {geo(v):.3f}, min {min(v):.3f}, max {max(v):.3f}, within 10%: {sum(x >= 0.9 for x in v)} of {len(v)}")
