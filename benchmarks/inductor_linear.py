"""Inductor's CPU GEMM against moespec's compiled small-n linear layer (issue 24: choose the means by
measurement), side by side in one run.

The issue left two ways to reach the roof: a torch C++ extension (what `moespec.moe.dense` and
`moespec.moe.compiled` are) or Inductor's CPU GEMM templates (`torch.compile` with max-autotune and
the "CPP" GEMM backend). This times, for each weight shape and n rows, three ways of running the
same stack of linear layers (one weight copy per layer, enough copies to exceed the last-level cache
four times over, as a decode pass runs its layers from memory):
- torch: `F.linear` layer after layer, eagerly;
- inductor: the whole stack compiled once per n by `torch.compile(mode="max-autotune-no-cudagraphs")`
  with `max_autotune_gemm_backends = "CPP,ATEN"` and frozen weights (Inductor packs them and picks
  its template or ATen's GEMM by timing, as it would in a compiled model);
- compiled: `moespec.moe.dense.linear` layer after layer.
beta = weight bytes / median time per call of the stack; the roof is the streaming read bandwidth
at the start and end of the run (the larger). Compilation time is reported beside.

    python benchmarks/inductor_linear.py --out benchmarks/results/inductor_linear.json
    python benchmarks/inductor_linear.py --n 1 --shapes down --dtypes float32 --reps 2 --out /tmp/il.json  # smoke
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.bench.timing import measure, read_bandwidth
from moespec.device import last_level_cache_bytes
from moespec.moe import dense

SHAPES = {"attn": (2048, 2048), "down": (2048, 1024)}  # name -> weight [out, in]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class Stack(torch.nn.Module):
    """`copies` linear layers of one shape, each applied to the same x: a pass's layers, from memory."""

    def __init__(self, weights: list[torch.Tensor]):
        super().__init__()
        self.layers = torch.nn.ModuleList()
        for w in weights:
            layer = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype)
            layer.weight = torch.nn.Parameter(w, requires_grad=False)
            self.layers.append(layer)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [layer(x) for layer in self.layers]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--n", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch._inductor.config as inductor_config

    inductor_config.max_autotune_gemm_backends = "CPP,ATEN"
    inductor_config.freezing = True
    console = Console()
    working_set = max(4 * (last_level_cache_bytes() or 0), 128 * 1024**2)
    dense.available()  # build before timing
    roofs = [read_bandwidth()]
    gen = torch.Generator().manual_seed(args.seed)
    records = []
    with torch.inference_mode():
        for dtype in args.dtypes:
            for shape in args.shapes:
                out_f, in_f = SHAPES[shape]
                nbytes = out_f * in_f * DTYPES[dtype].itemsize
                copies = max(1, math.ceil(working_set / nbytes))
                weights = [(torch.randn(out_f, in_f, generator=gen) / in_f**0.5).to(DTYPES[dtype])
                           for _ in range(copies)]
                stack = Stack(weights).eval()
                for n in args.n:
                    x = torch.randn(n, in_f, generator=gen).to(DTYPES[dtype])
                    torch._dynamo.reset()
                    compiled_stack = torch.compile(stack, mode="max-autotune-no-cudagraphs", dynamic=False)
                    start = time.perf_counter()
                    got = compiled_stack(x)  # compiles and autotunes
                    compile_s = time.perf_counter() - start
                    expected = [F.linear(x, w) for w in weights[:2]]
                    for g, e in zip(got[:2], expected):  # the same products, within the dtype's rounding
                        tol = 1e-4 if dtype == "float32" else 2e-2
                        torch.testing.assert_close(g, e, rtol=tol, atol=tol)
                    calls = {"torch": lambda: [F.linear(x, w) for w in weights],
                             "inductor": lambda: compiled_stack(x),
                             "compiled": lambda: [dense.linear(x, w) for w in weights]}
                    for fn in calls.values():
                        fn()
                    samples = {name: [] for name in calls}
                    for rep in range(args.reps):
                        for name in list(calls)[rep % 3:] + list(calls)[: rep % 3]:
                            samples[name] += measure(calls[name], reps=1, warmup=0).samples
                    for name, s in samples.items():
                        med = statistics.median(s)
                        records.append({"dtype": dtype, "shape": shape, "n": n, "impl": name, "copies": copies,
                                        "bytes": copies * nbytes, "median": med, "beta": copies * nbytes / med,
                                        "samples": s, "compile_s": compile_s if name == "inductor" else None})
                    console.print(f"{dtype} {shape} n={n}: inductor compiled in {compile_s:.0f} s; " + ", ".join(
                        f"{r['impl']} {r['beta'] / 1e9:.1f} GB/s" for r in records[-3:]))
                del stack, weights
    roofs.append(read_bandwidth())
    roof = max(roofs)
    artifacts.write(args.out, "inductor_linear_benchmark",
                    {"config": vars(args), "working_set": working_set, "read_bandwidth": roofs, "roof": roof,
                     "torch": torch.__version__, "records": records})
    table = Table("dtype", "shape", "n", "F.linear GB/s", "inductor GB/s", "compiled GB/s", "compiled / roof",
                  "inductor compile s", title=f"linear layers from memory; roof {roof / 1e9:.1f} GB/s "
                  f"(readings {', '.join(f'{r / 1e9:.1f}' for r in roofs)})")
    by = {(r["dtype"], r["shape"], r["n"], r["impl"]): r for r in records}
    for d, s, n in dict.fromkeys((r["dtype"], r["shape"], r["n"]) for r in records):
        t, i, c = (by[(d, s, n, k)] for k in ("torch", "inductor", "compiled"))
        table.add_row(d, s, str(n), f"{t['beta'] / 1e9:.1f}", f"{i['beta'] / 1e9:.1f}", f"{c['beta'] / 1e9:.1f}",
                      f"{c['beta'] / roof:.0%}", f"{i['compile_s']:.0f}")
    console.print(table)


if __name__ == "__main__":
    main()
