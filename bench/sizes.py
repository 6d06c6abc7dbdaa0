"""Run one measurement per fleet size on a private redis-server (reform_read.py, pool_round.py)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.helpers.cluster import RedisServer


def each_size(
    sizes: Iterable[int], measure: Callable[[RedisServer, int], dict[str, Any]], out: Path
) -> None:
    """`measure(server, size)` for each size, on one redis-server: each row printed as it is
    measured, all of them written to `out` as {"runs": [...]}."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            for size in sizes:
                row = measure(server, size)
                print(json.dumps(row), flush=True)
                runs.append(row)
        finally:
            server.stop()
    out.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
