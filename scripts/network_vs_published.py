"""Print simtrain's network model against R4 (DeepEP, H800) and R5 (nccl-tests, 8 H100/H200) of
../shared/reference/published_runs.md.

    .venv/bin/python scripts/network_vs_published.py
"""

from simtrain.collectives import estimate
from simtrain.deepep import estimate_ep
from simtrain.hardware import GB, load_profile

R4 = {8: ("nvlink", 153, 158), 16: ("nvlink", 43, 43), 32: ("rdma", 58, 57), 64: ("rdma", 51, 50)}


def main() -> None:
    print("| case | simtrain | published | error | bottleneck (simtrain / published) |")
    print("|---|---|---|---|---|")
    for hw_name in ("h100-sxm", "h200-sxm"):
        hw = load_profile(hw_name)
        for algo, ref, what in (("ring", 370, "busbw"), ("nvls", 477.5, "busbw"), ("nvls", 275, "algbw")):
            e = estimate("all-reduce", 8 * 2**30, hw, 8, algorithm=algo)
            got = (e.busbw_bytes_per_s if what == "busbw" else e.algbw_bytes_per_s) / GB
            print(f"| R5 {hw_name} 8 GPUs all-reduce {algo} {what}, 8 GiB | {got:.1f} GB/s | {ref} GB/s | "
                  f"{got / ref - 1:+.1%} | {e.bottleneck} |")
    hw = load_profile("h800")
    for ep, (link, *published) in R4.items():
        for op, ref in zip(("dispatch", "combine"), published):
            e = estimate_ep(op, hw, ep, 4096, 7168, 8, "fp8", node_limit=4)
            got = (e.nvlink_bytes_per_s if ep == 8 else e.rdma_bytes_per_s) / GB
            print(f"| R4 h800 EP {ep} {op} ({'NVL' if ep == 8 else 'RDMA'} metric) | {got:.1f} GB/s | {ref} GB/s | "
                  f"{got / ref - 1:+.1%} | {e.bottleneck} / {link} |")


if __name__ == "__main__":
    main()
