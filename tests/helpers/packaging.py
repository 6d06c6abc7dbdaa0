"""Building this repository's wheel, for the tests that install or inspect it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(directory: Path, source: Path = ROOT, version: str = "*") -> Path:
    """The wheel of `source` (this checkout), built into `directory` without its dependencies;
    `version`: the one to find there when it holds several."""
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q"]
    built = subprocess.run(
        [*pip, "-w", str(directory), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    return next(directory.glob(f"nodeagent-{version}-*.whl"))
