"""What a cold `k="auto"` call costs when nothing is noisy: the policy on exact step times.

`benchmarks/auto_k.py` times real decoding, where the policy's misses mix two causes: the rounds it
spends learning (the opening, each new k's untimed first round, probes) and the noise of the few
rounds it times. This removes the second. Each round of a simulated call draws its acceptances at
a fixed a (every draft accepted with probability a until the first rejection, as the oracle draft)
and takes exactly V(k) seconds, V read from a finished `auto_k.py` run (the policy's estimates at
the end of its oracle a = 0.98 case, the one with every k timed or priced) or given by --step-ms.
Against it, the best fixed k in hindsight on the same draws; --calls seeds per cell, tokens/s the
mean over them. No torch; seconds.

    python benchmarks/auto_k_sim.py --from benchmarks/results/auto_k.json --out benchmarks/results/auto_k_sim.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.engine.policy import AutoK, FixedK

ACCEPTANCES = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.98)


def simulate(policy, a: float, V: list[float], tokens: int, seed: int) -> float:
    """Tokens/s of one call of `tokens` new tokens under `policy`, exact step times V(k)."""
    rng = random.Random(seed)
    got, seconds = 0, 0.0
    while got < tokens:
        k = min(policy.choose(), tokens - got - 1)
        accepted = 0
        while accepted < k and rng.random() < a:
            accepted += 1
        policy.update(drafted=k, accepted=accepted, tested=min(k, accepted + 1), seconds=V[k])
        got += accepted + 1
        seconds += V[k]
    return got / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="source", help="an auto_k.py artifact to read V(0..8) from")
    ap.add_argument("--step-ms", type=float, nargs="+", help="V(0..max_k) in ms instead")
    ap.add_argument("--tokens", type=int, nargs="+", default=[96, 512])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if (args.source is None) == (args.step_ms is None):
        raise SystemExit("give one of --from AUTO_K_JSON and --step-ms V0 V1 ...")
    if args.source is not None:
        cases = json.load(open(args.source))["payload"]["cases"]
        case = next((c for c in cases if c["case"] == "oracle a=0.98"), None)
        if case is None:
            raise SystemExit(f"{args.source}: no 'oracle a=0.98' case to read V(k) from")
        V = case["auto_policy_last"]["step_s"]
    else:
        V = [ms / 1e3 for ms in args.step_ms]
    max_k = len(V) - 1
    rows = []
    for tokens in args.tokens:
        for a in ACCEPTANCES:
            fixed = {k: statistics.mean(simulate(FixedK(k), a, V, tokens, s) for s in range(args.calls))
                     for k in range(max_k + 1)}
            best = max(fixed, key=fixed.get)
            auto = statistics.mean(simulate(AutoK(max_k), a, V, tokens, s) for s in range(args.calls))
            rows.append({"tokens": tokens, "a": a, "best_k": best, "best_tokens_per_s": fixed[best],
                         "plain_tokens_per_s": fixed[0], "auto_tokens_per_s": auto,
                         "auto_over_best": auto / fixed[best], "auto_over_plain": auto / fixed[0]})
    artifacts.write(args.out, "auto_k_sim", {"config": vars(args), "V_s": V, "rows": rows})
    table = Table("new tokens", "a", "best fixed k", "auto / best", "auto / plain",
                  title="k='auto' from nothing on exact step times V(k) = "
                        + ", ".join(f"{1e3 * v:.1f}" for v in V) + f" ms; mean of {args.calls} calls")
    for r in rows:
        table.add_row(str(r["tokens"]), f"{r['a']:.2f}", str(r["best_k"]), f"{r['auto_over_best']:.2f}",
                      f"{r['auto_over_plain']:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
