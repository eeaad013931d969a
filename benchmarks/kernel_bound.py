"""What bounds the compiled expert kernel when one expert serves g tokens: memory or the cores.

One expert at OLMoE widths (hidden 2048, intermediate 1024: 25.2 MB in float32, 12.6 MB in
bfloat16), every one of g tokens routed to it (m = 1), so the deduplicating kernel reads it once
and computes g products. Timed two ways, side by side at each g, in float32 and bfloat16:
- from memory: a 256 MB read right before each call (`bench.timing.RoofReader`), which evicts
  the expert and gives the roof beside the call (the share is the median of the paired ratios);
- from cache: the same call repeated with no eviction, so the expert stays in the 32 MB L3 (and
  the bfloat16 one largely in L2): the rate the cores reach when memory is no limit.
A from-memory rate well below the from-cache rate means the kernel is waiting on memory; a
from-cache rate that falls as g grows, down to the from-memory rate, means the cores bound it (each
weight then meets g tokens: g multiply-adds per weight, plus a horizontal sum per row and token).

    python benchmarks/kernel_bound.py --out benchmarks/results/kernel_bound.json
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch
from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.bench import expert_op
from moespec.bench.timing import RoofReader, measure, share_of_roof
from moespec.models.synthetic import build
from moespec.moe import compiled
from moespec.moe.experts import expert_bytes


def one_expert(experts: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of `experts` that holds only its expert 0, in `dtype`."""
    one = copy.deepcopy(experts)
    for name in ("gate_up_proj", "down_proj"):
        setattr(one, name, torch.nn.Parameter(getattr(experts, name)[:1].to(dtype).contiguous(), requires_grad=False))
    one.num_experts = 1
    return one


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--g", type=int, nargs="+", default=list(range(1, 10)))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    if not compiled.available():
        raise SystemExit(f"the compiled kernels do not run here: {compiled.unavailable_reason()}")
    model, _ = build("olmoe-shaped", layers=1)
    experts = expert_op.layer_experts(model, 0).requires_grad_(False)
    reader = RoofReader()
    gen = torch.Generator().manual_seed(0)
    rows = []
    with torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            one = one_expert(experts, dtype)
            b = expert_bytes(one)
            for g in args.g:
                h = torch.randn(g, 2048, generator=gen).to(dtype)
                ids, w = torch.zeros(g, 1, dtype=torch.long), torch.ones(g, 1)

                def call():
                    return compiled.compiled_dedup(one, h, ids, w)

                call()
                cold, roofs, hot = [], [], []
                for _ in range(args.reps):
                    roofs.append(reader())
                    cold += measure(call, reps=1, warmup=0).samples
                    hot += measure(call, reps=3, warmup=1).samples
                rows.append({"dtype": str(dtype).removeprefix("torch."), "g": g, "bytes": b,
                             "memory_s": statistics.median(cold), "cache_s": statistics.median(hot),
                             "memory_GB_per_s": b / statistics.median(cold) / 1e9,
                             "cache_GB_per_s": b / statistics.median(hot) / 1e9,
                             "roof_GB_per_s": statistics.median(roofs) / 1e9,
                             "share_of_roof": share_of_roof(b, cold, roofs),
                             "macs_per_s_cache": 3 * 2048 * 1024 * g / statistics.median(hot)})
    artifacts.write(args.out, "kernel_bound", {"config": vars(args), "isa": compiled.isa(), "rows": rows})
    table = Table("dtype", "g", "from memory GB/s", "of roof beside", "from cache GB/s", "GMAC/s from cache",
                  title="one OLMoE-width expert, g tokens, compiled dedup kernel, 2 threads")
    for r in rows:
        table.add_row(r["dtype"], str(r["g"]), f"{r['memory_GB_per_s']:.1f}", f"{r['share_of_roof']:.0%}",
                      f"{r['cache_GB_per_s']:.1f}", f"{r['macs_per_s_cache'] / 1e9:.0f}")
    Console().print(table)


if __name__ == "__main__":
    main()
