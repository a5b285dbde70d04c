"""interleaved-1f1b with m not a multiple of p follows torch 2.13's flexible rounds: every order
equals ScheduleInterleaved1F1B's (tests/data/torch_interleaved_flexible.json, written by
tests/data/make_torch_flexible_orders.py), and every m torch refuses is refused."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from simtrain.schedules import generate
from simtrain.schedules.ir import ScheduleError

DATA = json.loads((Path(__file__).parent / "data" / "torch_interleaved_flexible.json").read_text())
RECORDS = DATA["records"]


def test_fixture_covers_flexible_cases():
    assert DATA["torch"].startswith("2.13")
    flexible = [r for r in RECORDS if r["orders"] is not None and r["microbatches"] % r["pp"]]
    refused = [r for r in RECORDS if r["orders"] is None]
    assert len(flexible) >= 50 and len(refused) >= 20


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: f"p{r['pp']}v{r['vp']}m{r['microbatches']}")
def test_orders_equal_torch(rec):
    p, v, m = rec["pp"], rec["vp"], rec["microbatches"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # vp = 1 warns that nothing is interleaved
        if rec["orders"] is None:
            with pytest.raises(ScheduleError, match=rf"runs {max(1, m // p)} rounds .* multiple of {max(1, m // p)}"):
                generate("interleaved-1f1b", p, m, v)
            return
        sched = generate("interleaved-1f1b", p, m, v)
    assert [[str(a) for a in order] for order in sched.orders] == rec["orders"]
