"""Issue 63 on booted nodes: the API service as the role installs it on a login host (n2 has
nodeagent_api_install; the pool's token key and pool.api_users are on every node:
tests/helpers/booted.py). It runs under the shipped unit as its own account, and a user reaches
it as docs/api.md says: on the host's Unix socket with no token (the kernel names the caller,
the service's MUNGE credential vouches for it, the pool leader on another node takes its word),
and from another machine on HTTPS with a token minted by `nodeagentctl token`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import ssl
from typing import Any

import httpx
import pytest

from tests.helpers.booted import API_NODE, API_UID, ROOT, BootedPool, Node
from tests.helpers.cluster import wait_for

pytestmark = [pytest.mark.booted, pytest.mark.timeout(600)]
SOCKET = "/run/nodeagent-api/api.sock"


def on_socket(
    node: Node, user: str, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """`curl` on the service's socket, run on `node` as `user`: the status and the document."""
    sent = f" -H 'content-type: application/json' -d {shlex.quote(json.dumps(body))}"
    script = (
        f"curl -sS -X {method} --unix-socket {SOCKET}{sent if body is not None else ''}"
        f" -w '\\n%{{http_code}}' http://api{path}"
    )
    text, _, status = node.sh(script, user=user).stdout.rpartition("\n")
    document: dict[str, Any] = json.loads(text)
    return int(status), document


def listening(host: Node) -> None:
    """Wait for the service's socket; fail with its journal."""
    try:
        wait_for(lambda: host.sh(f"test -S {SOCKET}", check=False).returncode == 0, 60, SOCKET)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{host.journal('nodeagent-api')[-4000:]}") from None
    active = host.systemctl("is-active", "nodeagent-api", check=False).stdout.strip()
    assert active == "active", host.journal("nodeagent-api")[-4000:]


def test_the_role_installs_the_api_service_that_users_reach_on_its_socket_and_with_a_token(
    pool: BootedPool,
) -> None:
    host = pool.node(API_NODE)
    # As the role installed it: the shipped unit, running as its own account; its files; the
    # pool's one token key and the service's account (one uid) on every node.
    listening(host)
    assert host.systemctl("show", "-p", "User", "--value", "nodeagent-api").stdout.strip() == (
        "nodeagent-api"
    )
    unit = host.sh("cat /etc/systemd/system/nodeagent-api.service").stdout
    assert unit.split("\n", 1)[1] == (ROOT / "systemd/nodeagent-api.service").read_text()
    files = host.sh("cd /etc/nodeagent && stat -c '%n %U:%G %a' api.yaml api.key api.crt")
    assert files.stdout.splitlines() == [
        "api.yaml root:nodeagent-api 640",
        "api.key root:nodeagent-api 640",
        "api.crt root:root 644",
    ]
    key = hashlib.sha256((pool.inventory.parent / "token.key").read_bytes()).hexdigest()
    for node in pool.nodes:
        held = node.sh("stat -c '%U:%G %a' /etc/nodeagent/token.key && id -u nodeagent-api")
        digest = node.sh("sha256sum /etc/nodeagent/token.key").stdout.split()[0]
        assert held.stdout.split() == ["root:root", "600", str(API_UID)], node.name
        assert digest == key, node.name

    # alice on the API host's socket: no token. A read, and a change the pool leader takes
    # from the service's word for her uid (pool.api_users, the same uid on its node).
    status, listed = on_socket(host, "alice", "GET", "/v1/nodes")
    assert status == 200 and sorted(n["name"] for n in listed["nodes"]) == ["n1", "n2", "n3"]
    job = "api-held-alice"
    spec = {"id": job, "entrypoint": ["/bin/sleep", "600"], "working_dir": "/tmp"}
    status, made = on_socket(host, "alice", "POST", "/v1/jobs", {"spec": spec, "hold": True})
    assert (status, made["job"], made["user"]) == (201, job, "alice"), made

    # alice's token, minted with her MUNGE credential, on HTTPS from this machine: her jobs
    # listed, hers cancelled; without a token, 401.
    token = pool.ctl("token", "--lifetime", "10m", user="alice", node=API_NODE).strip()
    assert token.startswith("nat1."), token
    verify = ssl.create_default_context(cafile=str(pool.api_cert))
    with httpx.Client(base_url=pool.api_url, verify=verify, timeout=60) as https:
        assert https.get("/v1/jobs").status_code == 401
        bearer = {"Authorization": f"Bearer {token}"}
        mine = https.get("/v1/jobs", params={"user": "alice"}, headers=bearer)
        assert mine.status_code == 200, mine.text
        assert {r["job"]: r["state"] for r in mine.json()["jobs"]}[job] == "pending", mine.text
        cancelled = https.post(f"/v1/jobs/{job}/cancel", headers=bearer)
        assert cancelled.status_code == 200, cancelled.text
        assert "cancel requested by alice" in cancelled.json()["message"]

    # The role again on the API host changes nothing (and so restarts nothing): the role's
    # idempotence, on a real node, for the agent's tasks and the API's (about 50 s).
    again = pool.playbook("site.yml", "--limit", API_NODE)  # an option after the playbook
    assert re.search(rf"{API_NODE}\s*:\s*ok=\d+\s+changed=0\s", again), again[-3000:]
