"""Which AOTInductor packages load and run on this torch: ragdot's ops, and one-op modules without ragdot.

    python benchmarks/aoti_probe.py ragdot-cpu      # also ragdot-cuda, mini-cpu, mini-str-cpu (mini-*: a Python
                                                    # custom op of one line, with a str argument for mini-str)

Each case exports a module, compiles it with AOTInductor, loads the package and runs it, printing each stage as
it passes (a crash names the stage it stopped at; faulthandler prints where). Run each case in a process of its
own. On torch 2.11 (an H100 machine, `benchmarks/results/h100-20261205/u3/`) every case crashed in
`aoti_load_package`; on torch 2.13 (the CI machine's CPU) the CPU cases run.
"""
import faulthandler
import sys

import torch


def _module(case: str, dev: str):
    """(module, example arguments) of a case."""
    if case.startswith("mini"):
        if "str" in case:
            @torch.library.custom_op("diag::mm_s", mutates_args=())
            def op_s(a: torch.Tensor, b: torch.Tensor, tag: str) -> torch.Tensor:
                return a @ b

            op_s.register_fake(lambda a, b, tag: a.new_empty(a.shape[0], b.shape[1]))
            call = lambda a, b: op_s(a, b, "x")  # noqa: E731
        else:
            @torch.library.custom_op("diag::mm", mutates_args=())
            def op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
                return a @ b

            op.register_fake(lambda a, b: a.new_empty(a.shape[0], b.shape[1]))
            call = op

        class Mini(torch.nn.Module):
            def forward(self, a, b):
                return call(a, b) + 1

        return Mini(), (torch.randn(4, 3, device=dev), torch.randn(3, 5, device=dev))
    import ragdot

    class Ragdot(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 16, 8, device=dev))

        def forward(self, x, sizes):
            return ragdot.ragged_dot(x, self.w, sizes)

    return Ragdot(), (torch.randn(20, 16, device=dev), torch.tensor([5, 0, 7, 6], device=dev))


def main(case: str) -> int:
    faulthandler.enable()
    module, args = _module(case, "cuda" if case.endswith("cuda") else "cpu")
    with torch.no_grad():
        program = torch.export.export(module, args)
        print(case, "exported", flush=True)
        path = torch._inductor.aoti_compile_and_package(program)
        print(case, "compiled", flush=True)
        loaded = torch._inductor.aoti_load_package(path)
        print(case, "loaded", flush=True)
        out, want = loaded(*args), module(*args)
        print(case, "ran", torch.equal(out[0] if isinstance(out, (list, tuple)) else out, want), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
