"""A night's evaluation against a judge that misbehaves the way providers do (issue 47).

    .venv/bin/python bench/faults.py [--rows 100000] [--concurrency 24] [--outage 60] [--max-cost 100]

Rows of two sentences and three passages each, scored by faithfulness and context precision with
an ``openai:/gpt-4o-mini`` judge (priced, so the cap is real) against a loopback
:class:`~mlflow_rag_eval.testing.faults.FaultyServer`, and by hit@3 and MRR (no judge). Three
runs in this process, each with the engine of every route (:func:`evaluate_records`):

1. fault-free, no cache: the reference wall time and scores;
2. the fault mix (:data:`RATES`: 429 with and without ``Retry-After``, 500, 503, resets before
   and mid-body, stalled sockets, trickled replies, negative / huge / missing usage, replies of
   the wrong shape) and, from half of the fault-free run's calls on, the provider down for
   ``--outage`` seconds; a fresh judge cache;
3. the same rows again with that cache: it must ask only for what run 2 could not judge.

It prints, per run: wall time, rows scored and failed by named reason (the counts add up), NaN
scores (none allowed), scores that differ from the fault-free run (none allowed), judge calls,
retries and cache hits, spend against the cap, and the process's RSS when a tenth of the rows
were scored and at the end (sampled every second). No timed assertion: figures to compare.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from production_traces import RssSampler  # noqa: E402  (this folder: the script's own)

from mlflow_rag_eval.evaluation.budget import Budget  # noqa: E402
from mlflow_rag_eval.evaluation.engine import evaluate_records  # noqa: E402
from mlflow_rag_eval.judges.cache import JudgeCache  # noqa: E402
from mlflow_rag_eval.judges.llm.judge import LLMJudge  # noqa: E402
from mlflow_rag_eval.judges.providers.openai import OpenAICompatBackend  # noqa: E402
from mlflow_rag_eval.records import Context, RagRecord  # noqa: E402
from mlflow_rag_eval.testing.faults import FaultMix, FaultyServer  # noqa: E402

METRICS = ["faithfulness", "context_precision", "hit@3", "mrr"]
#: per call; about 4.6% of calls get a fault, a provider on a bad night
RATES = {"429_retry_after": 0.01, "429": 0.005, "500": 0.003, "503": 0.01, "reset": 0.005, "reset_mid_body": 0.003,
         "stall": 0.0005, "trickle": 0.001, "usage_negative": 0.002, "usage_huge": 0.001, "usage_missing": 0.002,
         "wrong_count": 0.004}
#: requests the loopback server keeps (it counts them all): holding every prompt of 100,000 rows
#: was 12 KB a row of this process's RSS, the server's and not the package's
KEEP = 1000


def rows(n: int) -> list[RagRecord]:
    out = []
    for i in range(n):
        fare, line = 3 + i % 17, f"line {i % 97}"
        out.append(RagRecord(
            question=f"Question {i}: what does a bike ticket cost on {line}?",
            answer=f"Row {i}: a bike ticket costs {fare} euros on {line}. It is valid for one day.",
            contexts=[Context(id=f"p{i}-{k}", text=text) for k, text in enumerate([
                f"Passage {i}: bike tickets on {line} cost {fare} euros and are valid until midnight.",
                f"Dogs travel free on {line} when they are on a lead.",
                f"Seats on {line} can be reserved up to an hour before departure."])],
            relevant_ids={f"p{i}-0": 1.0},
        ))
    return out


def judge(server: FaultyServer, cache, concurrency: int) -> LLMJudge:
    return LLMJudge(OpenAICompatBackend("gpt-4o-mini", base_url=server.base_url), cache=cache,
                    concurrency=concurrency, timeout=3.0, deadline=60.0, backoff_base=0.2, backoff_max=5.0,
                    outage_budget=300.0)


def run(name: str, records, server, cache, concurrency: int, max_cost: float | None):
    j = judge(server, cache, concurrency)
    started = time.monotonic()
    with RssSampler(every=1.0) as rss:
        result = evaluate_records(records, METRICS, j, progress=False, budget=Budget(max_cost))
    wall = time.monotonic() - started
    usage = j.usage()
    j.close()
    print(f"\n== {name}: {wall:.1f} s for {len(records):,} rows")
    for m in result.metrics:
        s = m.figures().summary
        reasons = Counter(r.error.split(":")[0] for r in m.rows if r.error)
        nan = sum(1 for r in m.rows if r.value is not None and isinstance(r.value, float) and math.isnan(r.value))
        total = s.n_scored + s.n_error + s.n_skipped
        print(f"  {m.name:<18} scored {s.n_scored:>7,}  failed {s.n_error:>6,} {dict(reasons) or ''}  "
              f"not applicable {s.n_skipped:,}  (sum {total:,} of {len(records):,}; NaN {nan})")
    print(f"  judge: {usage.get('provider_calls', 0):,} calls, {usage.get('retries', 0):,} retries, "
          f"{usage.get('cache_hits', 0):,} cache hits, errors {usage.get('errors', {})}")
    spent = usage.get("cost_usd")
    print(f"  spend: ${spent if spent is not None else 0:.4f}" + (f" of a ${max_cost:g} cap" if max_cost else ""))
    if rss.samples:
        tenth = rss.samples[max(0, len(rss.samples) // 10 - 1)][1]
        per_row = (rss.samples[-1][1] - tenth) * 1024 / max(1, len(records) * 0.9)
        print(f"  RSS: {tenth:.0f} MiB at a tenth of the run, {rss.samples[-1][1]:.0f} MiB at the "
              f"end, peak {max(r for _, r in rss.samples):.0f} MiB; {per_row:.1f} KiB per row after the first "
              f"tenth")
    return result, usage, wall


def scores(result) -> dict[tuple[str, int], float]:
    return {(m.name, i): r.value for m in result.metrics for i, r in enumerate(m.rows) if r.error is None
            and r.value is not None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the provider is down mid-run")
    parser.add_argument("--max-cost", type=float, default=100.0, help="US dollars; 0: no cap")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.max_cost = args.max_cost or None
    records = rows(args.rows)
    with FaultyServer(FaultMix(), keep=KEEP) as clean:
        reference, ref_usage, ref_wall = run("fault-free", records, clean, False, args.concurrency, args.max_cost)
    calls = ref_usage.get("provider_calls", 0)
    mix = FaultMix(RATES, seed=args.seed, outage_after=calls // 2, outage_s=args.outage)
    with tempfile.TemporaryDirectory() as tmp, FaultyServer(mix, keep=KEEP) as server:
        cache = JudgeCache(Path(tmp) / "judge-cache.sqlite")
        faulty, usage, wall = run(f"faults + a {args.outage:g} s outage", records, server, cache, args.concurrency,
                                  args.max_cost)
        print(f"  served: {dict(mix.counts)}")
        print(f"  wall {wall:.1f} s = {wall / ref_wall:.2f}x the fault-free run; within 1.5x + the outage: "
              f"{wall <= 1.5 * ref_wall + args.outage}")
        failed = sum(1 for m in faulty.metrics for r in m.rows if r.error)
        mix.rates, mix.outage_after = {}, None
        before = server.calls
        rerun, rerun_usage, _ = run("rerun from the cache", records, server, cache, args.concurrency, args.max_cost)
        print(f"  the rerun asked {server.calls - before:,} requests for {failed:,} failed (row, metric) pairs")
    want = scores(reference)
    for name, result in (("faults", faulty), ("rerun", rerun)):
        got = scores(result)
        differ = [k for k, v in got.items() if k in want and abs(v - want[k]) > 1e-12]
        print(f"scores of the {name} run that differ from the fault-free run: {len(differ)} of {len(got):,}"
              + (f", e.g. {differ[:3]}" if differ else ""))


if __name__ == "__main__":
    main()
