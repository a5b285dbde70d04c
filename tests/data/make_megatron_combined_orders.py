"""Write tests/data/megatron_combined_1f1b_orders.json: the per-rank orders of Megatron-Core's
combined 1F1B (``--overlap-moe-expert-parallel-comm``) for pp 1-4 and 8, vp 1-3 and every m from 1
to 3·pp + 1, from Megatron-LM's own ordering functions.

Run with a clone of NVIDIA/Megatron-LM (a work tree or a bare git directory):
``.venv/bin/python tests/data/make_megatron_combined_orders.py PATH [COMMIT]``
(COMMIT defaults to d98e8a64ddf34856e74b24714e3bedb2f5a39553, the one recorded).

How. Megatron's three pure ordering functions are read from the given commit and executed as they
are (not copied here): ``get_pp_rank_microbatches`` (warm-up count, called with
``overlap_moe_expert_parallel_comm=True`` and a stand-in communicator giving the pipeline size,
rank and virtual pipeline size) and ``get_schedule_table`` from
``megatron/core/pipeline_parallel/schedules.py``, and ``convert_schedule_table_to_order`` from
``megatron/core/transformer/cuda_graphs.py``, which turns them into the chunk-level order the
interleaved schedule's loops issue (warm-up forwards; then forward i with backward i - W; then the
last W backwards; its docstring's example). The virtual microbatch of each entry comes from the
schedule table, in issue order per chunk (forwards and backwards both take each chunk's
microbatches in order: ``backward_step_helper_preprocess`` pops the oldest). In the steady state
each (forward, backward) couple is one ``combined_forward_backward_step`` call
(``forward_backward_helper_wrapper``), written as an ``OVERLAP_F_B`` pair.

Two cases do not go through those functions, as in Megatron: ``pp = 1`` runs
``combined_1f1b_schedule_for_no_pipelining`` (first forward alone, pairs, last backward alone:
recorded as W = 1; its docstring's phases), and with vp > 1 ``forward_backward_no_pipelining``
refuses model chunks. Megatron refuses a group outside ``[pp, m]`` and a last group shorter than pp
(``forward_backward_pipelining_with_interleaving``); the group is torch's flexible one
(``m / max(1, m // pp)``, pp when pp divides m, Megatron's default; with one chunk, where the
group does not change the order, m), passed as ``microbatch_group_size_per_vp_stage``; such refused
configurations have ``orders`` null.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
FUNCTIONS = {
    "megatron/core/pipeline_parallel/schedules.py": ("get_pp_rank_microbatches", "get_schedule_table"),
    "megatron/core/transformer/cuda_graphs.py": ("convert_schedule_table_to_order",),
}


def read(repo: Path, commit: str, path: str) -> str:
    """The file ``path`` of ``repo`` at ``commit``."""
    git = ["git", "--git-dir", str(repo)] if not (repo / ".git").exists() else ["git", "-C", str(repo)]
    return subprocess.run([*git, "show", f"{commit}:{path}"], check=True, capture_output=True, text=True).stdout


def load(repo: Path, commit: str) -> dict:
    """Megatron's functions, executed from their source with stand-ins for their annotations."""
    namespace = {"Optional": Optional, "P2PCommunicator": object, "parallel_state": None}
    for path, names in FUNCTIONS.items():
        tree = ast.parse(read(repo, commit, path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                exec(compile(ast.Module([node], []), path, "exec"), namespace)
    return namespace


def communicator(pp: int, rank: int, vp: int) -> SimpleNamespace:
    group = SimpleNamespace(size=lambda: pp, rank=lambda: rank)
    return SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vp)


def orders(meg: dict, pp: int, microbatches: int, vp: int) -> list[list[str]] | None:
    if pp == 1 and vp > 1:
        return None  # forward_backward_no_pipelining asserts one model chunk
    rounds = 1 if vp == 1 else max(1, microbatches // pp)  # one chunk: any legal group, e.g. m
    group = microbatches // rounds
    if microbatches % rounds or not pp <= group <= microbatches:
        return None
    if 0 < microbatches % group < pp:
        return None
    table = meg["get_schedule_table"](microbatches, vp, group)
    out = []
    for rank in range(pp):
        if pp == 1:
            warmup = min(1, microbatches)  # combined_1f1b_schedule_for_no_pipelining
        else:
            _, _, warmup, _ = meg["get_pp_rank_microbatches"](
                microbatches, vp, group, forward_only=False, overlap_moe_expert_parallel_comm=True,
                p2p_communicator=communicator(pp, rank, vp))
        chunk_order = meg["convert_schedule_table_to_order"](warmup, vp, table)
        fwd = iter(table)
        bwd = iter(table)
        actions = []
        for o in chunk_order:
            if o > 0:
                mb, chunk = next(fwd)
                assert chunk == o - 1
                actions.append(f"{chunk * pp + rank}F{mb}")
            else:
                mb, chunk = next(bwd)
                assert -o - 1 == vp - 1 - chunk  # Megatron: backward chunk = num_chunks - chunk - 1
                actions.append(f"{(vp - 1 - chunk) * pp + rank}B{mb}")
        total = len(table)
        steady = actions[warmup:len(actions) - warmup]  # forward i, backward i - W alternating
        pairs = [f"({steady[i]};{steady[i + 1]})OVERLAP_F_B" for i in range(0, len(steady), 2)]
        assert len(pairs) == total - warmup
        out.append(actions[:warmup] + pairs + actions[len(actions) - warmup:])
    return out


def main() -> None:
    repo = Path(sys.argv[1])
    commit = sys.argv[2] if len(sys.argv) > 2 else COMMIT
    meg = load(repo, commit)
    records = [{"pp": p, "vp": v, "microbatches": m, "orders": orders(meg, p, m, v)}
               for p in (1, 2, 3, 4, 8) for v in (1, 2, 3) for m in range(1, 3 * p + 2)]
    out = Path(__file__).with_name("megatron_combined_1f1b_orders.json")
    out.write_text(json.dumps({"megatron_lm": commit, "records": records}, separators=(",", ":")))
    print(f"{out}: {len(records)} records")


if __name__ == "__main__":
    main()
