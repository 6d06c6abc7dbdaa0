"""Running examples/train_lightning.py and examples/train_transformers.py as their own process,
one rank and no agent, and reading the lines they record (tests/integration/test_lightning.py,
test_transformers.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def train(script: Path, tmp_path: Path, name: str, **env: str) -> list[dict[str, Any]]:
    """Run `script` as its own process; its lines, in order."""
    records = tmp_path / name
    records.mkdir(exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    environ.update(RECORD_DIR=str(records), PYTHONUNBUFFERED="1", **env)
    subprocess.run([sys.executable, str(script)], env=environ, timeout=240, check=False)
    lines = []
    for path in sorted(records.glob("*.jsonl")):
        lines += [json.loads(text) for text in path.read_text().splitlines()]
    return sorted(lines, key=lambda line: line["t"])


def steps_of(lines: list[dict[str, Any]]) -> dict[int, tuple[Any, ...]]:
    """Step -> what the script says of it: epoch (and batch index), the batch, the rate, the
    parameters after it."""
    return {
        line["step"]: tuple(
            line[k] for k in ("epoch", "batch_idx", "batch_sum", "lr", "hash") if k in line
        )
        for line in lines
        if line["event"] == "step"
    }
