"""Per-turn cost of buffer callbacks inside one jitted program (static fori_loop, n turns): the floor a
ragdot.jax call pays on the program clock. deepseek3-test operands (5120x512, 256 groups of 512x512), bf16."""
import os, time
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.3")
import jax, jax.numpy as jnp, torch
from jax.experimental.buffer_callback import buffer_callback
import ragdot.jax as rj
from ragdot.jax._bridge import _Views
M, K, N, G = 5120, 512, 512, 256
dt = jnp.bfloat16
x = jax.random.normal(jax.random.key(0), (M, K), dt); w = jax.random.normal(jax.random.key(1), (G, K, N), dt)
s = jnp.full((G,), M // G, jnp.int32)
out = jax.ShapeDtypeStruct((M, N), dt)
views = {}
def wrap(ctx, o, *a):
    v = views.get(0)
    if v is None:
        v = views[0] = _Views(torch.device("cuda"), int(ctx.stream))
    v(o, *a)
def cai(ctx, o, *a):
    for b in (o, *a):
        b.__cuda_array_interface__["data"][0]
fns = {
    "buffer_callback + 4 __cuda_array_interface__ reads": buffer_callback(cai, out),
    "empty buffer_callback": buffer_callback(lambda ctx, o, *a: None, out),
    "buffer_callback + 4 views (ragdot's _Views)": buffer_callback(wrap, out),
    "ragdot.jax.ragged_dot": rj.ragged_dot,
    "jax.lax.ragged_dot": jax.lax.ragged_dot,
}
def looped(op, n):
    def run(a, b, c):
        def turn(_, carry):
            ops = jax.lax.optimization_barrier(carry[0])
            return ops, op(*ops)
        return jax.lax.fori_loop(0, n, turn, ((a, b, c), jnp.zeros((M, N), dt)))[1]
    return jax.jit(run)
def best(f, reps=5):
    f().block_until_ready()
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter(); f().block_until_ready(); t = min(t, time.perf_counter() - t0)
    return t
n = 100
for name, op in fns.items():
    p = looped(op, n)
    per_turn = best(lambda: p(x, w, s)) / n * 1e6
    j = jax.jit(op)
    def batch():
        r = None
        for _ in range(n): r = j(x, w, s)
        return r
    per_call = best(batch) / n * 1e6
    print(f"{name:45s} in a program: {per_turn:7.1f} us/turn   one jitted call at a time (batches of {n}): {per_call:7.1f} us/call")
