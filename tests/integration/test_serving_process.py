"""The pool leader's requests served in a process of its own (runtime/servechild.py), against a
real redis-server and a real munged: it answers a token-signed submission and tells the agent
when it took it and the spec it stored; it is the agent's only child for it, named by its
module; it ends when stopped, and when its agent is SIGKILLed; one killed is started again, no
sooner than RESTART_S after the last start, and serves again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from nodeagent.config.load import read_settings
from nodeagent.config.settings import NodeSettings
from nodeagent.coord.requests import RequestStore
from nodeagent.model.request import Verb
from nodeagent.model.spec import JobSpec
from nodeagent.runtime.servechild import MODULE, RESTART_S, ServingProcess
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.munge import MungeDaemon
from tests.helpers.poolrequests import answered, leader_of, spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pool_config(
    redis_server: RedisServer, munged: MungeDaemon, tmp_path: Path, job_id: str
) -> tuple[Path, bytes]:
    """A pool agent's config file (pool.auth munge, a token key) and the pool's token key."""
    key = os.urandom(32).hex().encode()  # the file's bytes are the key, as openssl writes it
    key_file = tmp_path / "token.key"
    key_file.write_bytes(key)
    key_file.chmod(0o600)
    config = {
        "node": {"name": "n0", "address": "127.0.0.1"},
        "redis": {"url": redis_server.url},
        "pool": {
            "name": f"{job_id}-pool",
            "auth": "munge",
            "munge_socket": munged.socket,
            "tokens": {"key_file": str(key_file)},
            "allow_root": True,
        },
        "log_dir": str(tmp_path / "logs"),
        "state_dir": str(tmp_path / "state"),
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, key


@pytest.fixture
def settings(pool_config: tuple[Path, bytes]) -> NodeSettings:
    return read_settings(pool_config[0])


@pytest.fixture
def told() -> list[tuple[JobSpec, str]]:
    return []


@pytest.fixture
def serving(settings: NodeSettings, told: list[tuple[JobSpec, str]]) -> Iterator[ServingProcess]:
    process = ServingProcess(settings, lambda spec, raw: told.append((spec, raw)))
    try:
        yield process
    finally:
        process.stop()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def submitted(
    redis_server: RedisServer, settings: NodeSettings, key: bytes, job: str
) -> tuple[str, Any]:
    """A token-signed submission of `job`, sent: its request id, and the pool's store."""
    store, _, _, signed, _ = leader_of(redis_server, settings.pool.name, key)
    requests = RequestStore(store.client, store.keys)
    return requests.send(signed(Verb.SUBMIT, spec(job))), store


def test_it_answers_and_tells_the_agent_when_and_what_it_stored(
    redis_server: RedisServer,
    settings: NodeSettings,
    pool_config: tuple[Path, bytes],
    serving: ServingProcess,
    told: list[tuple[JobSpec, str]],
    job_id: str,
) -> None:
    store, leader, _, _, _ = leader_of(redis_server, settings.pool.name, pool_config[1])
    before = time.monotonic()
    serving.lead(leader)
    request_id, store = submitted(redis_server, settings, pool_config[1], job_id)
    reply = answered(RequestStore(store.client, store.keys), request_id)
    assert reply.ok, reply.message
    wait_for(lambda: told, 30, "the agent told of the spec stored")
    spec_told, raw = told[0]
    assert raw == store.client.hget(store.keys.specs, job_id)
    assert spec_told == JobSpec.from_json(raw)
    assert spec_told.signature  # signed by the pool's key in the process
    assert serving.taken_at > before


def test_it_ends_when_stopped_and_is_started_again_after_it_died(
    redis_server: RedisServer,
    settings: NodeSettings,
    pool_config: tuple[Path, bytes],
    told: list[tuple[JobSpec, str]],
    job_id: str,
) -> None:
    now = [1000.0]
    serving = ServingProcess(settings, lambda spec, raw: told.append((spec, raw)), lambda: now[0])
    try:
        _, leader, _, _, _ = leader_of(redis_server, settings.pool.name, pool_config[1])
        serving.lead(leader)
        first = serving.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: gone(first), 30, "the serving process killed")
        now[0] += RESTART_S / 2
        serving.lead(leader)
        assert serving.pid == first  # too soon: not started again yet
        now[0] += RESTART_S
        serving.lead(leader)
        second = serving.pid
        assert second is not None and second != first
        request_id, store = submitted(redis_server, settings, pool_config[1], job_id)
        assert answered(RequestStore(store.client, store.keys), request_id).ok
    finally:
        serving.stop()
    assert gone(second)


AGENT = textwrap.dedent(
    """
    import sys, time
    from nodeagent.config.load import read_settings
    from nodeagent.runtime.servechild import ServingProcess

    if __name__ == "__main__":
        serving = ServingProcess(read_settings(sys.argv[1]), lambda spec, raw: None)
        serving.lead(sys.argv[2])
        print(serving.pid, flush=True)
        time.sleep(600)
    """
)


def test_it_ends_when_its_agent_is_killed(
    redis_server: RedisServer, settings: NodeSettings, pool_config: tuple[Path, bytes]
) -> None:
    _, leader, _, _, _ = leader_of(redis_server, settings.pool.name, pool_config[1])
    script = pool_config[0].parent / "agent.py"
    script.write_text(AGENT)
    agent = subprocess.Popen(
        [sys.executable, str(script), str(pool_config[0]), leader],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert agent.stdout is not None
        child = int(agent.stdout.readline())
        assert not gone(child)
        # its only child, named by what it runs (`ps`): no helper process of multiprocessing's
        [only] = psutil.Process(agent.pid).children()
        assert only.pid == child and MODULE in only.cmdline()
        agent.kill()
        agent.wait(30)
        wait_for(lambda: gone(child), 30, "the serving process ending with its agent")
    finally:
        agent.kill()
        agent.wait(30)
        if agent.stdout is not None:
            agent.stdout.close()
