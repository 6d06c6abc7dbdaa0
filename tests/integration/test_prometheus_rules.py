"""The alerting rules and scrape config, checked by Prometheus' own promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "config" / "prometheus"


def promtool(*args: str, cwd: Path = CONFIG) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is missing: apt-get install prometheus (.ci/setup does)")
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_rules_are_valid() -> None:
    result = promtool("check", "rules", "nodeagent-alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 14 rules found" in result.stdout


def test_every_alert_has_a_passing_unit_test() -> None:
    result = promtool("test", "rules", "nodeagent-alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    rules = (CONFIG / "nodeagent-alerts.yml").read_text()
    tests = (CONFIG / "nodeagent-alerts.test.yml").read_text()
    alerts = [line.split(":", 1)[1].strip() for line in rules.splitlines() if "- alert:" in line]
    assert len(alerts) == 14
    assert all(f"alertname: {name}" in tests for name in alerts)


def test_scrape_config_is_valid(tmp_path: Path) -> None:
    shutil.copy(CONFIG / "nodeagent-alerts.yml", tmp_path / "nodeagent-alerts.yml")
    config = (
        (CONFIG / "scrape-nodeagent.yml")
        .read_text()
        .replace("/etc/prometheus/nodeagent-alerts.yml", str(tmp_path / "nodeagent-alerts.yml"))
    )
    (tmp_path / "prometheus.yml").write_text(config)
    result = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
