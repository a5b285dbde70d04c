"""Compare pipeline schedules for Llama 3 70B on 64 H100s from Python (copy into a notebook cell).

    python examples/compare_schedules.py            # prints a table, writes compare_schedules.html

In a notebook, the last line of a cell that evaluates to a Report (or to the list compare()
returns) shows its summary table and timeline.
"""

import simtrain

model = simtrain.load_model("llama3-70b")  # or a HuggingFace config.json path
print(f"{model.name}: {model.total_params / 1e9:.1f}B parameters")

reports = simtrain.compare(
    model=model, hardware="h100-sxm", tp=8, pp=8, microbatches=16, seq_len=8192, vp=2,
    schedules=["gpipe", "1f1b", "interleaved-1f1b", "zbv"],
)
print(reports.to_frame()[["schedule", "step_time_s", "bubble_ratio", "exposed_comm_s", "mfu", "tokens_per_s"]]
      .to_string(index=False))

best = min(reports, key=lambda r: r.step_time_s)
busy = best.trace[best.trace["category"] == "compute"]
print(f"fastest: {best.schedule}, {best.step_time_s * 1e3:.1f} ms per step; "
      f"{len(busy)} compute tasks on {busy['rank'].nunique()} ranks")

print(f"wrote {reports.write_html('compare_schedules.html', title='Llama 3 70B on 64 H100s')}")
