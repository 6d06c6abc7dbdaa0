"""An allocation (issue 82): its spec (a holder a node, kind allocation) and the variables its
shell is given (views/allocation.py), pure."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from nodeagent.cli.ctl import alloc
from nodeagent.cli.ctl.parser import parser
from nodeagent.errors import ConfigError, UsageError
from nodeagent.model.gpus import GpuUnit
from nodeagent.model.pool import PoolJob, PoolJobState, PoolNode
from nodeagent.model.spec import JobSpec, load_spec
from nodeagent.pool import holders
from nodeagent.pool.schedview import JobView
from nodeagent.views.allocation import HOLDER, allocation_env, node_gpus


def args(*argv: str) -> argparse.Namespace:
    return parser().parse_args(["alloc", *argv])


def test_an_allocation_is_a_job_of_one_holder_a_node_handed_no_gpu() -> None:
    spec = alloc.spec_of(
        args("--name", "dev", "--nodes", "2", "--gpus-per-node", "1"), "alice", "x"
    )
    assert (spec.id, spec.kind, spec.user, spec.gpus_per_node) == ("dev", "allocation", "alice", 1)
    assert spec.job.entrypoint == HOLDER and spec.job.nproc_per_node == 1
    assert spec.job.gpus_per_worker == 0 and spec.job.max_restarts == 0
    assert (spec.job.min_nodes, spec.job.max_nodes) == (2, 2)
    again = JobSpec.from_json(spec.to_json())  # as the pool stores it
    assert again.kind == "allocation" and again.to_dict() == spec.to_dict()
    assert "kind" not in load_spec({"id": "j", "entrypoint": ["x"]}, default_user="a").to_dict()


def test_a_bad_allocation_or_kind_names_what_is_wrong() -> None:
    with pytest.raises(UsageError, match=r"^alloc: gpus_per_node: must be within 1\.\."):
        alloc.spec_of(args("--gpus-per-node", "0"), "alice", "x")
    with pytest.raises(ConfigError, match=r"^kind: must be one of batch, allocation, got 'x'"):
        load_spec({"id": "j", "entrypoint": ["x"], "kind": "x"}, default_user="a")


def test_the_shell_is_told_the_nodes_their_gpus_and_a_master() -> None:
    units = (GpuUnit("GPU-0", job="dev"), GpuUnit("GPU-1", job="other"), GpuUnit("GPU-2"))
    nodes = {n: PoolNode(n, "10.0.0.1", 5000, gpus=units) for n in ("n1", "n2")}
    gpus = node_gpus("dev", nodes, ["n1", "n2"])
    assert gpus == {"n1": ["GPU-0"], "n2": ["GPU-0"]}
    env = allocation_env("dev", "default", "gpu", ["n1", "n2"], "10.0.0.1:41234", gpus)
    assert env["NODEAGENT_NODELIST"] == env["SLURM_JOB_NODELIST"] == "n1,n2"
    assert env["NODEAGENT_GPUS"] == "n1=GPU-0 n2=GPU-0"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "41234")
    assert (env["SLURM_NNODES"], env["SLURM_GPUS_PER_NODE"], env["SLURM_JOB_PARTITION"]) == (
        "2",
        "1",
        "gpu",
    )
    bare = allocation_env("dev", "default", "default", ["n1"], None, {"n1": []})
    assert bare["MASTER_ADDR"] == "n1" and bare["MASTER_PORT"] == "29500"
    assert "SLURM_GPUS_PER_NODE" not in bare  # no GPUs said


def test_an_attended_allocation_lapses_once_its_holder_stops_renewing() -> None:
    """pool/holders.py: one renewed until later stays; one never renewed gets TTL_MS from
    its submission; one being cancelled, ended, or made through the API is left alone."""
    now = 1_000_000

    def view(name: str, submitted: int, **more: object) -> JobView:
        status = PoolJob(PoolJobState.RUNNING, seq=1, submitted_ms=submitted)
        return replace(JobView(name, status, 1, 1, 1, attended=True), **more)  # type: ignore[arg-type]

    old = now - holders.TTL_MS - 1
    jobs = [
        view("kept", old),
        view("gone", old),
        view("fresh", now - 1000),  # its first renewal may not have come yet
        view("never", old),
        view("cancelling", old, cancel="alice"),
        view("api", old, attended=False),
        replace(
            view("ended", old), status=PoolJob(PoolJobState.CANCELLED, seq=1, submitted_ms=old)
        ),
    ]
    until = {"kept": now + 5000, "gone": now - 1, "fresh": None, "never": None}
    assert holders.lapsed(jobs, until, now) == ["gone", "never"]
    spec = alloc.spec_of(args("--nodes", "1"), "alice", "x")
    assert spec.attended and JobSpec.from_json(spec.to_json()).attended
    with pytest.raises(ConfigError, match=r"^attended: only an allocation is attended"):
        load_spec({"id": "j", "entrypoint": ["x"], "attended": True}, default_user="a")
