"""Cost of one progress beat (nodeagent.worker.beat): what a training loop pays per step.

.venv/bin/python bench/beat.py        # prints the median of 7 runs of 200,000 beats
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.channel import beats  # noqa: E402
from nodeagent.worker import progress as worker_progress  # noqa: E402  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank-0.progress"
        beats.create(path)
        os.environ[worker_progress.ENV] = str(path)
        beat = worker_progress.beat
        number = 200_000
        runs = [timeit.timeit(lambda: beat(1), number=number) / number * 1e6 for _ in range(7)]
        assert beats.read(path) is not None
    result = {
        "beat_us_median": round(statistics.median(runs), 3),
        "beat_us_min": round(min(runs), 3),
        "runs": 7,
        "beats_per_run": number,
    }
    out = ROOT / "bench" / "results" / "beat.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
