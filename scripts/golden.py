"""Behaviour check for refactors: record, then compare, the ``--json`` rows (and trace hashes) of
every built-in scenario (``simtrain/scenarios/``) and of a fixed set of unit-cost runs.

    python scripts/golden.py record golden.json      # on the commit before the change
    python scripts/golden.py check golden.json       # after it: exit 1 and list what moved

Each case runs ``simtrain compare ... --json --csv T.csv --trace T.json`` in a subprocess (so it
checks what a user sees, whatever the internals). ``rows`` must be identical for a
behaviour-preserving change; ``trace_sha256`` (the CSV trace table and the Chrome trace with its
memory counters) is reported too, for changes that promise bit-identical traces.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from simtrain.scenario import SCENARIO_DIR

ROOT = Path(__file__).resolve().parent.parent
SIMTRAIN = [sys.executable, "-c", "from simtrain.cli import main; main()"]

UNIT = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--op-times", "1,1,1", "--no-comm"]
UNEVEN = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--op-times", "1,2,1.5", "--no-comm"]
CASES: dict[str, list[str]] = {
    **{f"scenario:{p.stem}": [str(p)] for p in sorted(SCENARIO_DIR.glob("*.yaml"))},
    "unit:p4m8": UNIT + ["--pp", "4", "--microbatches", "8", "--vp", "2", "--schedules",
                         "gpipe,1f1b,interleaved-1f1b,looped-bfs,interleaved-zb,zb-h1,zb-h2,zbv,dualpipe,dualpipev"],
    "unit:p8m16": UNIT + ["--pp", "8", "--microbatches", "16", "--vp", "2", "--schedules",
                          "gpipe,1f1b,interleaved-1f1b,zb-h1,zb-h2,zbv,dualpipe,dualpipev"],
    "uneven:p4m8": UNEVEN + ["--pp", "4", "--microbatches", "8", "--vp", "2", "--schedules",
                             "gpipe,1f1b,interleaved-1f1b,zb-h1,zb-h2,zbv,dualpipe,dualpipev"],
    "real:dense-tp-dp": ["--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "2", "--pp", "4", "--dp", "2",
                         "--microbatches", "8", "--vp", "2", "--zero-stage", "1", "--recompute", "full",
                         "--schedules", "gpipe,1f1b,interleaved-1f1b,zb-h1,zbv,dualpipe,dualpipev"],
    "real:moe-ep": ["--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--tp", "1", "--pp", "4", "--dp", "8",
                    "--ep", "8", "--microbatches", "8", "--schedules", "1f1b,1f1b+waved-ep,dualpipev",
                    "--zero-stage", "1"],
    "real:forward-only": ["--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--pp", "2", "--dp", "8",
                          "--ep", "8", "--microbatches", "4", "--schedules", "1f1b,1f1b+waved-ep",
                          "--forward-only"],
}


def run_case(args: list[str]) -> dict:
    """Run one case; returns ``{"rc", "rows", "stderr", "trace_sha256"}``."""
    with tempfile.TemporaryDirectory() as tmp:
        csv, trace = Path(tmp) / "t.csv", Path(tmp) / "t.json"
        proc = subprocess.run(SIMTRAIN + ["compare", *args, "--json", "--csv", str(csv), "--trace", str(trace)],
                              capture_output=True, text=True, cwd=ROOT)
        digest = hashlib.sha256()
        for f in (csv, trace):
            if f.exists():
                digest.update(f.read_bytes())
        try:
            rows = json.loads(proc.stdout) if proc.stdout.strip() else None
        except json.JSONDecodeError:
            rows = proc.stdout
        return {"rc": proc.returncode, "rows": rows, "stderr": proc.stderr.strip().splitlines()[-1:],
                "trace_sha256": digest.hexdigest()}


def main() -> int:
    """``record FILE`` or ``check FILE [CASE...]``; returns the exit status."""
    if len(sys.argv) < 3 or sys.argv[1] not in ("record", "check"):
        print(__doc__)
        return 2
    mode, path, only = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    cases = {k: v for k, v in CASES.items() if not only or k in only}
    if mode == "record":
        results = {}
        for name, args in cases.items():
            results[name] = run_case(args)
            print(f"{name}: rc {results[name]['rc']}", flush=True)
        path.write_text(json.dumps(results, indent=1, sort_keys=True))
        return 0
    golden = json.loads(path.read_text())
    moved = 0
    for name, args in cases.items():
        now, before = run_case(args), golden.get(name)
        if before is None:
            print(f"{name}: not in {path}")
            continue
        rows_same = now["rows"] == before["rows"] and now["rc"] == before["rc"]
        trace_same = now["trace_sha256"] == before["trace_sha256"]
        moved += not rows_same
        print(f"{name}: rows {'identical' if rows_same else 'DIFFER'}, trace "
              f"{'identical' if trace_same else 'differs'}", flush=True)
        if not rows_same:
            _diff(before["rows"], now["rows"], name)
    print(f"{moved} of {len(cases)} cases moved")
    return 1 if moved else 0


def _diff(a, b, where: str, shown: list[int] | None = None) -> None:
    """Print the first differing leaves of two JSON values."""
    shown = shown if shown is not None else [0]
    if shown[0] >= 10:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            _diff(a.get(k), b.get(k), f"{where}.{k}", shown)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{where}[{i}]", shown)
    elif a != b:
        shown[0] += 1
        print(f"   {where}: {str(a)[:80]} -> {str(b)[:80]}")


if __name__ == "__main__":
    sys.exit(main())
