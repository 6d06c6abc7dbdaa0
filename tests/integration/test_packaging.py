"""The wheel: both commands, the typed package, and the shipped configuration examples."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.helpers.packaging import build_wheel


@pytest.mark.slow
def test_wheel_contents(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert "nodeagent/py.typed" in names
    data = [n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n]
    assert sorted(data) == [
        "share/nodeagent/config/nodeagent.example.yaml",
        "share/nodeagent/grafana/nodeagent-dashboard.json",
        "share/nodeagent/prometheus/nodeagent-alerts.yml",
        "share/nodeagent/prometheus/scrape-nodeagent.yml",
        "share/nodeagent/systemd/nodeagent-api.service",
        "share/nodeagent/systemd/nodeagent.service",
    ]
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "nodeagent = nodeagent.cli.daemon:main" in text
    assert "nodeagentctl = nodeagent.cli.ctl:main" in text
