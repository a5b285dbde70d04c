"""Record the measured-trace fixtures of the overlay tests (run by hand; needs torch).

Runs one real training step of ``torch.distributed.pipelining`` on 2 CPU ranks (gloo, one thread
each) under ``torch.profiler``, for two schedules:

* ``ScheduleGPipe`` (one stage per rank; torch labels its actions ``Forward i`` / ``Backward i``),
* ``ScheduleInterleaved1F1B`` (two stages per rank; torch's runtime labels every action
  ``PP:<action>``, e.g. ``PP:2F1``, ``PP:1SEND_F0``, ``PP:0RECV_B3``).

Each rank's profiler output is ``export_chrome_trace``'s JSON, trimmed to keep the fixtures small:
only the ``user_annotation`` events (the schedule's ``record_function`` labels and
``ProfilerStep#N``) and the process/thread metadata are kept; every kept event and the top-level
fields (``distributedInfo`` with the rank, ``baseTimeNanoseconds``, ...) are torch's, unchanged.

Usage: ``.venv/bin/python tests/data/make_torch_traces.py`` (writes tests/data/torch_*_rank*.json).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, ScheduleInterleaved1F1B

HERE = Path(__file__).resolve().parent
HIDDEN, BATCH, MICROBATCHES, BLOCKS_PER_STAGE = 256, 32, 4, 2


def block() -> torch.nn.Module:
    return torch.nn.Sequential(*[m for _ in range(BLOCKS_PER_STAGE)
                                 for m in (torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU())])


def trim(raw: dict) -> dict:
    keep = [e for e in raw["traceEvents"] if e.get("cat") == "user_annotation" or e.get("ph") == "M"]
    return {**raw, "traceEvents": keep}


def worker(rank: int, world: int, init_file: str, kind: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    stages_per_rank = 1 if kind == "gpipe" else 2
    num_stages = world * stages_per_rank
    stage_ids = [rank + i * world for i in range(stages_per_rank)]  # looped placement
    x = torch.randn(BATCH, HIDDEN)
    target = torch.randn(BATCH, HIDDEN)
    loss_fn = torch.nn.MSELoss()
    stages = [PipelineStage(block(), s, num_stages, torch.device("cpu")) for s in stage_ids]
    if kind == "gpipe":
        schedule = ScheduleGPipe(stages[0], MICROBATCHES, loss_fn=loss_fn)
    else:
        schedule = ScheduleInterleaved1F1B(stages, MICROBATCHES, loss_fn=loss_fn)

    def step() -> None:
        first, last = 0 in stage_ids, num_stages - 1 in stage_ids
        kwargs = {"target": target, "losses": []} if last else {}
        schedule.step(x, **kwargs) if first else schedule.step(**kwargs)

    step()  # warm-up, not recorded
    dist.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("ProfilerStep#1"):
            step()
        dist.barrier()
    path = Path(out_dir) / f"raw{rank}.json"
    prof.export_chrome_trace(str(path))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    for kind in ("gpipe", "interleaved"):
        with tempfile.TemporaryDirectory() as tmp:
            init = os.path.join(tmp, "init")
            mp.spawn(worker, args=(2, init, kind, tmp), nprocs=2, join=True)
            for rank in range(2):
                raw = json.loads((Path(tmp) / f"raw{rank}.json").read_text())
                out = HERE / f"torch_{kind}_rank{rank}.json"
                out.write_text(json.dumps(trim(raw), indent=0))
                print(out, out.stat().st_size, "bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
