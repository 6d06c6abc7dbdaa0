"""How long a CUDA worker fenced by the keeper takes to die and to free its GPU memory.

    python bench/gpu_fence.py [--gib 20] [--reps 5]    # on a machine with an NVIDIA GPU

The fence keeper SIGKILLs a worker at 90 % of the lease, leaving 10 % (0.5 s at the default
5 s lease) before the server may re-form without it. On a GPU a SIGKILLed process stops running
its own code at once, but the driver tears its context down before the process is gone and its
memory is free. This measures both, for a worker that holds `--gib` GiB and keeps a kernel
queue busy, fenced through the real keeper (nodeagent.supervisor.fence): one that ignores
SIGTERM (busy
in a collective: only the SIGKILL ends it) and one that dies of the SIGTERM 0.5 s earlier
(negative figures). Writes bench/results/gpu_fence.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nodeagent.supervisor.fence import Group, Keeper, start_ticks

WORKER = """
import signal, sys, time, torch
if sys.argv[2] == "ignore-term":  # busy in a collective, or saving: only SIGKILL ends it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
while True:
    a = a @ a
    a /= a.norm()
"""


def gpu_used_mib() -> float:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.split()[0])


def once(gib: float, keeper: Keeper, on_term: str) -> dict[str, float | str]:
    """One worker fenced by the keeper: SIGTERM 0.5 s before SIGKILL; times from the SIGKILL."""
    baseline = gpu_used_mib()
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(gib), on_term],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    started = start_ticks(proc.pid)
    assert started is not None
    held = gpu_used_mib() - baseline
    kill_at = time.monotonic() + 1.0
    keeper.update(kill_at - 0.5, kill_at, [Group(proc.pid, started)])
    proc.wait()
    gone = time.monotonic()
    while gpu_used_mib() > baseline + 0.1 * held:
        time.sleep(0.005)
    freed = time.monotonic()
    keeper.update(None, None, [])
    proc.stdout.close()
    return {
        "on_term": on_term,
        "held_mib": round(held),
        "kill_to_gone_s": round(gone - kill_at, 4),
        "kill_to_memory_freed_s": round(freed - kill_at, 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=20.0)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu_fence.json"))
    args = parser.parse_args()
    keeper = Keeper(None)
    keeper.start()
    try:
        runs = [
            once(args.gib, keeper, on_term)
            for on_term in ("ignore-term", "die-on-term")
            for _ in range(args.reps)
        ]
    finally:
        keeper.close()
    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    result: dict[str, object] = {"gpu": gpu, "gib": args.gib, "runs": runs}
    for on_term in ("ignore-term", "die-on-term"):
        mine = [r for r in runs if r["on_term"] == on_term]
        for what in ("kill_to_gone_s", "kill_to_memory_freed_s"):
            values = [float(r[what]) for r in mine]
            result[f"{on_term} {what}"] = {
                "median": statistics.median(values),
                "max": max(values),
            }
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    os.sync()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
