"""Spread of simtrain's prediction error over repeated calibrate + validate runs on this machine.

Each run calibrates a NEW profile (``simtrain calibrate --quick``, optionally with a trimmed
GEMM grid) and validates it against real torch pipeline runs (``simtrain validate --json``);
the load average before and after each run is printed next to its errors, since other
processes sharing the cores are the main source of spread.

    .venv/bin/python benchmarks/validation_spread.py --runs 3                    # all seven schedules
    .venv/bin/python benchmarks/validation_spread.py --runs 5 --trimmed \\
        --schedules gpipe,1f1b,zbvzerobubble --steps 4 --warmup 1                # the CI test's setting
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _simtrain(args: list[str]) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "simtrain", *args], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"simtrain {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--schedules", default=None, help="comma-separated (default: all seven)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--trimmed", action="store_true", help="calibrate one GEMM shape (h 256, 256 tokens)")
    parser.add_argument("--out", type=Path, help="write all rows as JSON here")
    args = parser.parse_args()

    all_rows = []
    summaries = []
    for run in range(1, args.runs + 1):
        load_before = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as tmp:
            profile = Path(tmp) / "cpu.yaml"
            cal = ["calibrate", "--device", "cpu", "--quick", "--out", str(profile)]
            if args.trimmed:
                cal += ["--hidden", "256", "--tokens", "256"]
            _simtrain(cal)
            val = ["validate", "--profile", str(profile), "--world", "2", "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--json"]
            if args.schedules:
                val += ["--schedules", args.schedules]
            rows = json.loads(_simtrain(val).stdout)
        load_after = os.getloadavg()[0]
        errors = [abs(r["step_error"]) for r in rows]
        summaries.append((statistics.median(errors), max(errors), max(abs(r["memory_error"]) for r in rows)))
        print(f"run {run}: load average {load_before:.2f} -> {load_after:.2f}")
        for r in rows:
            print(f"  {r['schedule']:22s} measured {r['measured_step_s'] * 1e3:7.1f} ms  predicted "
                  f"{r['predicted_step_s'] * 1e3:7.1f} ms  error {r['step_error']:+6.1%}  "
                  f"speed {1 / r['speed_factor']:.2f}x  memory error {r['memory_error']:+.2%}")
        print(f"  median |step error| {summaries[-1][0]:.1%}, max {summaries[-1][1]:.1%}, "
              f"max |memory error| {summaries[-1][2]:.2%}", flush=True)
        all_rows.append(dict(run=run, load_before=load_before, load_after=load_after, rows=rows))
    print(f"over {args.runs} runs: median |step error| per run {[f'{s[0]:.1%}' for s in summaries]}, "
          f"max per run {[f'{s[1]:.1%}' for s in summaries]}")
    if args.out:
        args.out.write_text(json.dumps(all_rows, indent=2))


if __name__ == "__main__":
    main()
