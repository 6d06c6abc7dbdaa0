"""The save's stall of torchtitan's own Trainer on a GPU: nodeagent's checkpoint manager (the
memory tier) against torchtitan's own in its fastest mode (`async_with_pinned_mem`: staged into
pinned host memory, written to disk from a thread), the same model, the same steps, one run
after the other on the same GPU.

Runs examples/train_torchtitan_trainer.py under torchrun (one rank, FSDP2 on NCCL) with
--flavor (torchtitan's llama3 "1B" by default) for --steps steps with a save every --every,
and reads each step's `save_s` (the time of the Trainer's `checkpointer.save` call: what the
step waits for). Prints the figures and writes them to bench/results/torchtitan-gpu.json.

    python bench/torchtitan_gpu.py [--flavor 1B] [--steps 16] [--every 5] [--memory /dev/shm/x]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_torchtitan_trainer.py"
RESULTS = ROOT / "bench" / "results" / "torchtitan-gpu.json"


def run(system: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    records = work / system / "records"
    records.mkdir(parents=True)
    memory = Path(args.memory) / system
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
        "RECORD_DIR": str(records),
        "DUMP_DIR": str(work / system / "dump"),
        "FLAVOR": args.flavor,
        "MAX_STEPS": str(args.steps),
        "SAVE_EVERY": str(args.every),
        "SEQ_LEN": str(args.seq_len),
        "LOCAL_BATCH": "1",
        "NODEAGENT_CKPT_MEMORY": str(memory),
        "NODEAGENT_RESTORE": "start",
    }
    if system == "torchtitan":
        env["CHECKPOINTER"] = "torchtitan"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    began = time.monotonic()
    done = subprocess.run([*command, str(SCRIPT)], env=env, capture_output=True, text=True)
    took = time.monotonic() - began
    shutil.rmtree(memory, ignore_errors=True)
    lines = [json.loads(t) for p in records.glob("*.jsonl") for t in p.read_text().splitlines()]
    steps = sorted((x for x in lines if x["event"] == "step"), key=lambda x: x["step"])
    if done.returncode != 0 or not steps:
        print(done.stderr[-3000:], file=sys.stderr)
    saves = [x["save_s"] for x in steps if x["step"] % args.every == 0]
    others = [x["save_s"] for x in steps if x["step"] % args.every and x["step"] != args.steps]
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(steps)]
    return {
        "system": system,
        "exit": done.returncode,
        "wall_s": round(took, 1),
        "steps": len(steps),
        "save_s_each": saves,
        "save_s_first": saves[0] if saves else None,
        "save_s_later_median": statistics.median(saves[1:]) if len(saves) > 1 else None,
        "other_step_call_s_median": statistics.median(others) if others else None,
        "step_interval_s_median": round(statistics.median(gaps), 4) if gaps else None,
        "loss_first_last": [steps[0]["loss"], steps[-1]["loss"]] if steps else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flavor", default="1B")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--memory", default="/dev/shm/nodeagent-bench")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    import torch

    work = Path(tempfile.mkdtemp(prefix="titan-bench-"))
    rows = [run(system, args, work) for system in ("nodeagent", "torchtitan")]
    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "flavor": args.flavor,
        "seq_len": args.seq_len,
        "steps": args.steps,
        "every": args.every,
        "memory_dir": args.memory,
        "rows": rows,
    }
    print(json.dumps(doc, indent=1))
    args.results.write_text(json.dumps(doc, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
