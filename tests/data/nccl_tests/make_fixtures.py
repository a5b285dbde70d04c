"""Write the nccl-tests fixtures of tests/test_nccl_tests.py from a KNOWN profile.

These logs are NOT measurements: simtrain's own writer (simtrain.nccl_tests.format_log) prints, in
nccl-tests' output format, the times simtrain.collectives predicts on ``known-h100.yaml`` (h100-sxm
with NVLink efficiency 0.79 and NIC efficiency 0.91). The round-trip test fits them back.

    .venv/bin/python tests/data/nccl_tests/make_fixtures.py
"""

from pathlib import Path

from simtrain.hardware import load_profile
from simtrain.nccl_tests import BINARY_OF, format_log

HERE = Path(__file__).resolve().parent
SIZES = [2**20 * 2**i for i in range(0, 14)]  # 1 MiB .. 8 GiB, nccl-tests -b 1M -e 8G -f 2
CASES = [("all-reduce", 8, 8), ("all-gather", 8, 8), ("reduce-scatter", 16, 8), ("all-reduce", 16, 4),
         ("all-to-all", 16, 8), ("p2p", 2, 1)]


def main() -> None:
    hw = load_profile(HERE / "known-h100.yaml")
    for op, gpus, per_node in CASES:
        name = f"{BINARY_OF[op]}_{gpus}gpus_{gpus // per_node}nodes.txt"
        (HERE / name).write_text(format_log(op, hw, gpus, per_node, SIZES))
        print(HERE / name)


if __name__ == "__main__":
    main()
