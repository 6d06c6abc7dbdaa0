"""The environment a worker gets under nodeagent against the one torchrun 2.13 gives the same
script on this machine (both run here), and the error file a rank's @record writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodeagent.supervisor.errorfile import read_error_file
from tests.helpers.cluster import LocalCluster, RedisServer

TORCHRUN = Path(sys.executable).with_name("torchrun")
DUMP = """
import json, os, sys
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(dict(os.environ), f)
"""
RAISE = """
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise ValueError("bad batch size 0")

main()
"""
# Compared by value: what the variable means is the same under both launchers, so is its value.
SAME_VALUE = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)
# Present under both, values naming addresses, ports, the run id, a file or the store may differ.
MAY_DIFFER = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE",
)
UNSET = ("OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PYTHONUNBUFFERED")

pytestmark = pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed")


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in UNSET}


def _under_torchrun(script: Path, out: Path) -> dict[str, dict[str, str]]:
    out.mkdir()
    subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(script), str(out)],
        env=_base_env(),
        check=True,
        capture_output=True,
        timeout=120,
    )
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def _cluster(redis_server: RedisServer, workdir: Path, job_id: str, script: Path) -> LocalCluster:
    return LocalCluster(
        redis_server.url,
        workdir,
        job=job_id,
        nproc=2,
        max_nodes=1,
        max_restarts=0,
        entrypoint=["python", str(script), str(workdir / "nodeagent")],
        job_options={"env": {}},
    )


def _finished(cluster: LocalCluster) -> dict[str, Any]:
    return cluster.wait_status(
        lambda d: d["state"] in ("succeeded", "failed"), 120, "the job to finish"
    )


def test_every_torchrun_variable_is_there_with_the_same_meaning(
    redis_server: RedisServer, workdir: Path, job_id: str
) -> None:
    script = workdir / "dump_env.py"
    script.write_text(DUMP)
    torchrun = _under_torchrun(script, workdir / "torchrun")
    assert sorted(torchrun) == ["0", "1"]
    base = _base_env()
    (workdir / "nodeagent").mkdir()
    cluster = _cluster(redis_server, workdir, job_id, script)
    try:
        cluster.start("a")
        assert _finished(cluster)["state"] == "succeeded", cluster.diagnostics()
    finally:
        cluster.stop()
    ours = {p.stem: json.loads(p.read_text()) for p in (workdir / "nodeagent").glob("*.json")}
    assert sorted(ours) == ["0", "1"]
    for rank in ("0", "1"):
        theirs = torchrun[rank]
        # What torchrun itself sets: everything the worker sees that the launching shell lacks
        # (LC_CTYPE is the interpreter's own locale coercion, under both).
        set_by_torchrun = {k for k in theirs if base.get(k) != theirs[k] and k != "LC_CTYPE"}
        assert set_by_torchrun == set(SAME_VALUE) | set(MAY_DIFFER)
        missing = set_by_torchrun - set(ours[rank])
        assert not missing, f"rank {rank}: torchrun sets {sorted(missing)}, nodeagent does not"
        for key in SAME_VALUE:
            assert ours[rank][key] == theirs[key], (rank, key)
        assert Path(ours[rank]["TORCHELASTIC_ERROR_FILE"]).name == f"rank-{rank}.error.json"


def test_a_rank_raising_under_record_writes_its_root_cause(
    redis_server: RedisServer, workdir: Path, job_id: str
) -> None:
    pytest.importorskip("torch")
    script = workdir / "raise.py"
    script.write_text(RAISE)
    cluster = _cluster(redis_server, workdir, job_id, script)
    try:
        cluster.start("a")
        doc = _finished(cluster)
    finally:
        cluster.stop()
    assert doc["state"] == "failed"
    causes = [
        read_error_file(path) for path in sorted((workdir / "logs" / job_id).glob("*/*.error.json"))
    ]
    assert causes, "no rank wrote TORCHELASTIC_ERROR_FILE"
    for cause in causes:
        assert cause == f"ValueError: bad batch size 0 (at {script}:6 in main)"
