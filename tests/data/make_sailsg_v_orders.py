"""Write tests/data/sailsg_v_orders.json: the per-rank compute orders of sail-sg's V-Half and V-Min
("Pipeline Parallelism with Controllable Memory", Qi et al., NeurIPS 2024, arXiv:2405.15362) for
pp 1-6 and 8 and m from 1 to 2·pp + 2 plus 3·pp and 4·pp.

The oracle is sail-sg/zero-bubble-pipeline-parallelism itself, read from a git directory at a fixed
commit (nothing of it is copied into this repository): ``scheduler/zbv_greedy.py``'s
``PipelineGraph(p, m, "half" | "min", 1000, 1000, 1000, 1).create_schedule(config)``, the call
``zerobubble/runtime.py`` makes for ``--zero-bubble-v-schedule-mem-setup half|min``, on a
``GraphConfig.basic_config(1000., 1000., 1000., p, m, max_chunks=2)``. Only ``graph.py`` and
``zbv_greedy.py`` are loaded (they are pure Python); the package ``__init__`` that pulls in Megatron
is bypassed. sail-sg's B is the input-gradient backward (its W is separate), written ``I`` here; a
node's stage is its ``layer_group_idx`` (rank r holds stages r and 2p-1-r).

Run: ``python tests/data/make_sailsg_v_orders.py GIT_DIR [COMMIT]``, e.g. with the git directory of a
clone of https://github.com/sail-sg/zero-bubble-pipeline-parallelism (COMMIT defaults to the one
recorded below).
"""

import contextlib
import io
import json
import subprocess
import sys
import types
from pathlib import Path

REPO = "sail-sg/zero-bubble-pipeline-parallelism"
COMMIT = "39f2c186a27580b7051eb51e0f651e1efd0a8170"  # main, 2025-05-07
PACKAGE = "megatron.core.pipeline_parallel.zerobubble.scheduler"
FILES = ("graph", "zbv_greedy")


def load(git_dir: str, commit: str) -> types.ModuleType:
    """sail-sg's zbv_greedy module, executed from ``git show COMMIT:path`` with stub parent packages."""
    parts = PACKAGE.split(".")
    for i in range(1, len(parts) + 1):
        stub = types.ModuleType(".".join(parts[:i]))
        stub.__path__ = []
        sys.modules[stub.__name__] = stub
    for name in FILES:
        path = PACKAGE.replace(".", "/") + f"/{name}.py"
        source = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"],
                                check=True, capture_output=True, text=True).stdout
        module = types.ModuleType(f"{PACKAGE}.{name}")
        sys.modules[module.__name__] = module
        exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the oracle's own code
    return sys.modules[f"{PACKAGE}.zbv_greedy"]


def orders(greedy: types.ModuleType, setup: str, p: int, m: int) -> list[str]:
    """One string of space-separated actions per rank, e.g. ``"0F0 0F1 7F0 7I0 7W0 ..."``."""
    graph = sys.modules[f"{PACKAGE}.graph"]
    config = graph.GraphConfig.basic_config(1000.0, 1000.0, 1000.0, p, m, 2)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its bubble rate
        local_order = greedy.PipelineGraph(p, m, setup, 1000, 1000, 1000, 1).create_schedule(config)
    kind = {"F": "F", "B": "I", "W": "W"}
    return [" ".join(f"{n.layer_group_idx}{kind[str(n.type)]}{n.microbatch}" for n in rank)
            for rank in local_order]


def main() -> None:
    git_dir = sys.argv[1]
    commit = sys.argv[2] if len(sys.argv) > 2 else COMMIT
    greedy = load(git_dir, commit)
    records = [{"schedule": f"v-{setup}", "p": p, "m": m, "orders": orders(greedy, setup, p, m)}
               for setup in ("half", "min") for p in (1, 2, 3, 4, 5, 6, 8)
               for m in sorted(set(range(1, 2 * p + 3)) | {3 * p, 4 * p})]
    out = Path(__file__).with_name("sailsg_v_orders.json")
    out.write_text(json.dumps({
        "source": f"https://github.com/{REPO}/blob/{commit}/{PACKAGE.replace('.', '/')}/zbv_greedy.py",
        "call": "PipelineGraph(p, m, setup, 1000, 1000, 1000, 1).create_schedule("
                "GraphConfig.basic_config(1000.0, 1000.0, 1000.0, p, m, 2)), as zerobubble/runtime.py",
        "format": "orders[rank] = space-separated '<stage><F|I|W><microbatch>'; stages r and 2p-1-r on rank r",
        "records": records,
    }, indent=0))
    print(f"{out}: {len(records)} records")


if __name__ == "__main__":
    main()
