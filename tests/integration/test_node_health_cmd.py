"""`nodeagent health`: the node-local GPU preflight, run as the CLI against FakeNvml files.

No Redis anywhere: the configs point at a port nothing listens on.
"""

from __future__ import annotations

import argparse
import getpass
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.cli import nodehealth
from nodeagent.cli.daemon import main
from tests.helpers.gpus import gpu

NOWHERE = "redis://127.0.0.1:1/0"


def config(tmp_path: Path, health: dict[str, Any], **job: Any) -> Path:
    """A complete, valid config for node h1 with this health: section."""
    data = {
        "node": {"name": "h1", "address": "127.0.0.1"},
        "redis": {"url": NOWHERE},
        "job": {
            "id": "preflight",
            "entrypoint": [sys.executable, "-c", "pass"],
            "user": getpass.getuser(),  # root too, where the tests run as root
            "allow_root": True,
            **job,
        },
        "metrics": {"listen": "127.0.0.1:0"},
        "log_dir": str(tmp_path / "logs"),
        "state_dir": str(tmp_path / "state"),
        "health": health,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def fake(tmp_path: Path, *gpus: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A health: section reading FakeNvml from a file with these GPUs."""
    path = tmp_path / "gpus.yaml"
    path.write_text(yaml.safe_dump({"gpus": list(gpus), **extra}))
    return {"gpu": "auto", "fake_gpus": str(path)}


def health(capsys: pytest.CaptureFixture[str], path: Path, *flags: str) -> tuple[int, str, str]:
    code = main(["health", "--config", str(path), *flags])
    out, err = capsys.readouterr()
    return code, out, err


def health_json(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, dict[str, Any]]:
    code, out, _ = health(capsys, path, "--json")
    doc = json.loads(out)
    assert doc["exit_code"] == code
    return code, doc


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**base, **changes}


def test_healthy_gpus_exit_0_with_a_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, fake(tmp_path, gpu(0), gpu(1)), nproc_per_node=2)
    code, out, err = health(capsys, path)
    assert code == 0, out + err
    assert "GPU 0: healthy" in out and "GPU 1: healthy" in out
    assert "node h1: healthy: 2 GPUs usable" in out and not err


def test_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hot = with_(gpu(1), clocks_event_reasons=0x40, temperature_c=85)
    path = config(tmp_path, fake(tmp_path, gpu(0), hot), nproc_per_node=2)
    code, doc = health_json(capsys, path)
    assert code == 0
    assert doc["node"] == "h1" and doc["available"] is True and doc["reason"] is None
    assert doc["gpus_needed"] == 2 and doc["usable"] == [0, 1]
    assert doc["cordon"] is None and doc["unfit"] is None and doc["config_error"] is None
    assert [g["index"] for g in doc["gpus"]] == [0, 1]
    first, second = doc["gpus"]
    assert first["uuid"] == "GPU-fake-0" and first["bus_id"] == "00000000:3B:00.0"
    assert (first["health"], first["action"], first["reason"]) == ("healthy", "none", "ok")
    assert first["readings"]["temperature_c"] == 45 and first["readings"]["power_w"] == 250
    assert first["readings"]["xids"] == [] and first["readings"]["error"] is None
    # degraded (a throttled GPU) is still usable
    assert (second["health"], second["action"]) == ("degraded", "none")
    assert "thermal slowdown" in second["reason"]


@pytest.mark.parametrize(
    ("bad", "action", "reason"),
    [
        ({"ecc_uncorrected_volatile": 2}, "drain_node", "2 uncorrected ECC errors"),
        ({"remapped_rows": [0, 1, True, False]}, "reset_gpu", "row remapping pending"),
        ({"errors": {"all": 15}}, "reboot_node", "GPU is lost"),
        ({"temperature_c": 95}, "drain_node", "95 C >= limit 90 C"),
    ],
    ids=["ecc", "remap", "lost", "hot"],
)
def test_a_gpu_the_agent_would_drain_exits_1(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    bad: dict[str, Any],
    action: str,
    reason: str,
) -> None:
    path = config(tmp_path, fake(tmp_path, gpu(0), with_(gpu(1), **bad)))
    code, out, err = health(capsys, path)
    assert code == 1, out + err
    assert "GPU 1: unhealthy" in out and action in out and reason in out
    assert "node h1: unhealthy, the agent would cordon and drain it: GPU 1:" in out
    code, doc = health_json(capsys, path)
    assert code == 1 and doc["usable"] == [0] and doc["cordon"].startswith("GPU 1:")
    assert (doc["gpus"][1]["health"], doc["gpus"][1]["action"]) == ("unhealthy", action)


def test_a_node_level_xid_exits_1_an_application_one_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    section = fake(tmp_path, gpu(0), gpu(1), xids=[{"gpu": 1, "xid": 13}])
    code, doc = health_json(capsys, config(tmp_path, section))
    assert code == 0 and doc["gpus"][1]["readings"]["xids"] == []  # the job's fault, not the GPU's
    section = fake(tmp_path, gpu(0), gpu(1), xids=[{"gpu": 1, "xid": 13}, {"gpu": 1, "xid": 79}])
    code, doc = health_json(capsys, config(tmp_path, section))
    assert code == 1 and doc["gpus"][1]["readings"]["xids"] == [79]
    assert (doc["gpus"][1]["action"], doc["gpus"][1]["reason"]) == (
        "reboot_node",
        "XID 79 (node-level)",
    )


def test_fewer_usable_gpus_than_the_job_needs_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU that fell off the bus may not even be listed: every listed one is healthy."""
    path = config(tmp_path, fake(tmp_path, gpu(0), gpu(1)), nproc_per_node=4)
    code, out, _ = health(capsys, path)
    assert code == 1
    assert "node h1: unhealthy, the agent would not take part: 2 usable GPUs of 2" in out
    path = config(tmp_path, fake(tmp_path, gpu(0)), nproc_per_node=4, gpus_per_worker=0)
    assert health(capsys, path)[0] == 0  # a CPU-only job needs none


def test_thresholds_come_from_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    section = fake(tmp_path, with_(gpu(0), ecc_uncorrected_volatile=2, pcie_replays=50))
    assert health(capsys, config(tmp_path, {**section, "max_ecc_uncorrected": 2}))[0] == 0
    strict = {**section, "max_ecc_uncorrected": 2, "max_pcie_replays": 10}
    code, doc = health_json(capsys, config(tmp_path, strict))
    assert code == 1 and doc["gpus"][0]["reason"] == "50 PCIe replays (max 10)"


def test_gpu_off_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    section = {**fake(tmp_path, with_(gpu(0), ecc_uncorrected_volatile=9)), "gpu": "off"}
    code, out, _ = health(capsys, config(tmp_path, section))
    assert code == 3 and "GPU monitoring unavailable (health.gpu is off)" in out
    code, doc = health_json(capsys, config(tmp_path, section))
    assert code == 3 and doc["available"] is False and doc["gpus"] == []
    assert doc["reason"] == "health.gpu is off"


def test_no_driver_exits_3_or_78_when_gpu_is_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    section = fake(tmp_path, gpu(0), init_error=12)  # NVML_ERROR_LIBRARY_NOT_FOUND
    code, doc = health_json(capsys, config(tmp_path, section))
    assert code == 3 and "no NVIDIA driver library" in doc["reason"]
    code, out, _ = health(capsys, config(tmp_path, {**section, "gpu": "on"}))
    assert code == 78 and "`nodeagent run` exits 78" in out  # as the agent refuses to start


def test_real_nvml_without_a_driver_exits_3(tmp_path: Path) -> None:
    """The installed command, real NVML, on a machine without an NVIDIA driver."""
    from tests.conftest import _nvml_works

    if _nvml_works():
        pytest.skip("this machine has a working NVIDIA driver (tests/gpu covers it)")
    path = config(tmp_path, {"gpu": "auto"})
    result = subprocess.run(
        [sys.executable, "-m", "nodeagent", "health", "--config", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["available"] is False and doc["gpus"] == []
    assert doc["reason"].startswith(("no NVIDIA driver", "the NVIDIA driver is not loaded"))


def test_without_a_config_the_default_settings_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(config=None, json=True)
    code = nodehealth.run(args, str(tmp_path / "absent.yaml"))
    doc = json.loads(capsys.readouterr().out)
    assert code == doc["exit_code"] and code in (0, 1, 3)  # 3 here, without a driver
    assert doc["available"] is (code != 3) and doc["gpus_needed"] is None
    assert doc["config_error"] is None


@pytest.mark.parametrize(
    ("health_section", "key"),
    [
        ({"gpu": "maybe"}, "health.gpu"),
        ({"max_ecc_uncorrected": -1}, "health.max_ecc_uncorrected"),
        ({"fake_gpus": "/nonexistent/gpus.yaml"}, "health.fake_gpus"),
        ({"interval": "5s", "colour": "red"}, "health.colour"),
    ],
)
def test_an_invalid_health_section_exits_78(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], health_section: dict[str, Any], key: str
) -> None:
    code, out, err = health(capsys, config(tmp_path, health_section))
    assert code == 78 and not out
    assert err.startswith(f"nodeagent: invalid configuration: {key}:")


def test_an_unreadable_or_broken_file_exits_78(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = health(capsys, tmp_path / "absent.yaml")  # named, so it must be there
    assert code == 78 and "cannot read config file" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("health: [unclosed\n")
    code, _, err = health(capsys, broken)
    assert code == 78 and "not valid YAML" in err
    broken.write_text(yaml.safe_dump({"node": {"name": "bad name!"}, "health": {}}))
    code, _, err = health(capsys, broken)
    assert code == 78 and "node.name" in err


def test_a_config_invalid_elsewhere_still_checks_the_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown job.user (a node not set up yet): the health: section is still used."""
    bad = with_(gpu(1), ecc_uncorrected_volatile=3)
    section = {**fake(tmp_path, gpu(0), bad), "max_ecc_uncorrected": 5}
    path = config(tmp_path, section, user="no-such-user-here")
    code, out, err = health(capsys, path)
    assert code == 0, out + err  # the section's threshold (5) was applied
    assert "GPU 1: healthy" in out and "node h1: healthy" in out
    assert "warning: invalid configuration (job.user:" in err
    code, doc = health_json(capsys, path)
    assert doc["node"] == "h1" and doc["config_error"].startswith("job.user:")
    assert doc["gpus_needed"] is None  # the job could not be read: its GPU count is unknown


def test_a_pool_node_without_a_job_section_checks_only_its_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pool.yaml"
    section = fake(tmp_path, gpu(0))
    path.write_text(
        yaml.safe_dump({"node": {"name": "p1"}, "redis": {"url": NOWHERE}, "health": section})
    )
    code, out, err = health(capsys, path, "--json")
    doc = json.loads(out)
    assert code == 0 and not err
    assert doc["node"] == "p1" and doc["gpus_needed"] is None and doc["config_error"] is None
