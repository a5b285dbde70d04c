"""Write tests/data/torch_interleaved_flexible.json: the per-rank compute orders of torch 2.13's
``ScheduleInterleaved1F1B`` for pp 2, 3, 4, 8, vp 1-3 and every m from 1 to 3·pp + 1, including
the m that are not multiples of pp (torch's flexible rounds). ``orders`` is null where torch
refuses m. Run with torch 2.13 installed: ``.venv/bin/python tests/data/make_torch_flexible_orders.py``.

The orders come from the class's own ``_calculate_single_rank_operations`` on an instance built
without process groups (only the attributes that method reads are set, as its ``__init__`` sets
them); the ``None`` idle slots it pads with are dropped.
"""

import json
from pathlib import Path

import torch
from torch.distributed.pipelining import schedules as ts


def orders(pp: int, microbatches: int, vp: int) -> list[list[str]] | None:
    sched = object.__new__(ts.ScheduleInterleaved1F1B)
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = pp, vp, microbatches
    sched.number_of_rounds = max(1, microbatches // pp)  # as ScheduleInterleaved1F1B.__init__
    if microbatches % sched.number_of_rounds:
        return None  # __init__ raises ValueError here
    sched.microbatches_per_round = microbatches // sched.number_of_rounds
    return [[str(a) for a in sched._calculate_single_rank_operations(r) if a is not None] for r in range(pp)]


records = [{"pp": p, "vp": v, "microbatches": m, "orders": orders(p, m, v)}
           for p in (2, 3, 4, 8) for v in (1, 2, 3) for m in range(1, 3 * p + 2)]
out = Path(__file__).with_name("torch_interleaved_flexible.json")
out.write_text(json.dumps({"torch": torch.__version__, "records": records}, separators=(",", ":")))
print(f"{out}: {len(records)} records")
