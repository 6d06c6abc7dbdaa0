"""nodeagent's Python client: the pool from a notebook, a pipeline or a service (docs/api.md).

    from nodeagent.client import Client

    with Client("https://login1:8443", token=open("token").read().strip()) as pool:
        job = pool.submit(["python", "train.py"], nodes=2, nproc_per_node=8)
        for line in pool.logs(job, rank=0, follow=True):
            print(line)

`Client(socket="/run/nodeagent-api/api.sock")` on the API host needs no token: the kernel
names you. Every method is one call of the API; an error the service answers is raised as
`ApiError` with its status and the service's own words. A change (a submission, a cancel...)
carries an Idempotency-Key and is sent again with it when the service could not be reached or
answered 503 (Redis away, the change not yet on its replicas), TRIES times at most: the pool
takes it once. It needs httpx only (`pip install nodeagent[client]`), not the agent's
dependencies.
"""

from __future__ import annotations

import json
import ssl
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

ENDED = frozenset({"succeeded", "failed", "cancelled", "timeout", "preempted"})
CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
TRIES = 3  # a change is sent this many times at most, with the same Idempotency-Key
RETRY_AFTER_MAX_S = 5.0


class ApiError(Exception):
    """What the API service refused or failed, in its words (RFC 9457 problem details)."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(f"{status} {title}: {detail}")
        self.status = status
        self.title = title
        self.detail = detail


class Client:
    """A connection to the API service: a URL with a token, or its Unix socket."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        socket: str | None = None,
        verify: str | bool | ssl.SSLContext = True,
        timeout: float = 60.0,
    ) -> None:
        """Args:
        url: the service's HTTPS address, such as https://login1:8443.
        token: an API token (`nodeagentctl token`): needed on a network address.
        socket: the service's Unix socket instead of `url`.
        verify: the CA bundle that signed the service's certificate (True: the system's).
        """
        if (url is None) == (socket is None):
            raise ValueError("give the service's url or its socket (one of the two)")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        transport = httpx.HTTPTransport(uds=socket) if socket else None
        if isinstance(verify, str):  # a CA bundle's path
            verify = ssl.create_default_context(cafile=verify)
        self._http = httpx.Client(
            base_url=url or "http://nodeagent",
            headers=headers,
            transport=transport,
            verify=verify,
            timeout=timeout,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- jobs --------------------------------------------------------------------------------

    def submit(
        self,
        command: Sequence[str] | None = None,
        *,
        name: str | None = None,
        nodes: int | str | None = None,
        nproc_per_node: int | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        hold: bool = False,
        spec: Mapping[str, Any] | None = None,
    ) -> str:
        """Submit a job; its id. `nodes`: N, or "MIN:MAX" (elastic); `spec`: any more of the
        spec document (docs/pool.md), which the arguments override."""
        doc: dict[str, Any] = dict(spec or {})
        if command is not None:
            doc["entrypoint"] = list(command)
        if nodes is not None:
            low, _, high = str(nodes).partition(":")
            doc.update(min_nodes=int(low), max_nodes=int(high or low))
        given = {
            "id": name,
            "nproc_per_node": nproc_per_node,
            "env": dict(env) if env is not None else None,
            "working_dir": workdir,
            "queue": queue,
            "priority": priority,
        }
        doc.update({k: v for k, v in given.items() if v is not None})
        done = self._call("POST", "/v1/jobs", json={"spec": doc, "hold": hold})
        return str(done["job"])

    def allocate(
        self,
        nodes: int = 1,
        *,
        gpus_per_node: int | None = None,
        time_limit: str | None = None,
        name: str | None = None,
        queue: str | None = None,
        spec: Mapping[str, Any] | None = None,
    ) -> str:
        """Hold `nodes` nodes for your own commands (nodeagentctl alloc, as salloc); its id.
        It runs until `cancel(id)` or its `time_limit` ("2h"); `spec`: more of its shape
        (exclusive, selector, mem, ...: docs/interactive.md), which the arguments override."""
        doc: dict[str, Any] = {**(spec or {}), "min_nodes": nodes, "max_nodes": nodes}
        given = {
            "id": name,
            "gpus_per_node": gpus_per_node,
            "time_limit": time_limit,
            "queue": queue,
        }
        doc.update({k: v for k, v in given.items() if v is not None})
        done = self._call("POST", "/v1/allocations", json={"spec": doc})
        return str(done["job"])

    def jobs(
        self,
        *,
        user: str | None = None,
        state: str | None = None,
        queue: str | None = None,
        array: str | None = None,
    ) -> list[dict[str, Any]]:
        given = {"user": user, "state": state, "queue": queue, "array": array}
        params = {k: v for k, v in given.items() if v}
        rows: list[dict[str, Any]] = self._call("GET", "/v1/jobs", params=params)["jobs"]
        return rows

    def show(self, job: str) -> dict[str, Any]:
        """The job in full: spec, times, generations, restarts by cause, goodput."""
        shown: dict[str, Any] = self._call("GET", f"/v1/jobs/{job}")
        return shown

    def status(self, job: str) -> dict[str, Any]:
        """The job's nodes, their workers and the checkpoints (`nodeagentctl status`)."""
        found: dict[str, Any] = self._call("GET", f"/v1/jobs/{job}/status")
        return found

    def wait(self, job: str, *, timeout: float | None = None, poll: float = 1.0) -> dict[str, Any]:
        """Wait for the job to end; its `show`.

        Raises:
            TimeoutError: it had not ended after `timeout` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            shown = self.show(job)
            if shown.get("state") in ENDED:
                return shown
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job} is still {shown.get('state')} after {timeout} s")
            time.sleep(poll)

    def cancel(self, job: str) -> str:
        return self._said("POST", f"/v1/jobs/{job}/cancel")

    def scale(self, job: str, target: int | str) -> str:
        """N nodes, or "+N" / "-N" from the current target."""
        return self._said("POST", f"/v1/jobs/{job}/scale", json={"target": str(target)})

    def hold(self, job: str) -> str:
        return self._said("POST", f"/v1/jobs/{job}/hold")

    def release(self, job: str) -> str:
        return self._said("POST", f"/v1/jobs/{job}/release")

    def requeue(self, job: str) -> str:
        return self._said("POST", f"/v1/jobs/{job}/requeue")

    def history(
        self, *, since: str | None = None, user: str | None = None, state: str | None = None
    ) -> list[dict[str, Any]]:
        """The ended jobs: the pool's, then the accounting database's older ones."""
        params = {k: v for k, v in {"since": since, "user": user, "state": state}.items() if v}
        rows: list[dict[str, Any]] = self._call("GET", "/v1/history", params=params)["jobs"]
        return rows

    def report(
        self,
        by: str = "user",
        *,
        since: str | None = None,
        until: str | None = None,
        user: str | None = None,
    ) -> list[dict[str, Any]]:
        """Usage by user, queue or day, from the accounting database (docs/accounting.md)."""
        given = {"by": by, "since": since, "until": until, "user": user}
        params = {k: v for k, v in given.items() if v}
        rows: list[dict[str, Any]] = self._call("GET", "/v1/report", params=params)["rows"]
        return rows

    def share(self) -> dict[str, Any]:
        """Each user's fair share, usage and factor (docs/pool.md, "Fair share")."""
        doc: dict[str, Any] = self._call("GET", "/v1/share")
        return doc

    def logs(
        self, job: str, rank: int = 0, *, tail: int = 20, follow: bool = False
    ) -> Iterator[str]:
        """The rank's last `tail` lines; with `follow`, then every line it writes, across its
        generations and nodes, until the job ends."""
        path = f"/v1/jobs/{job}/logs/{rank}"
        params = {"tail": tail, "follow": follow}
        if not follow:
            yield from self._call("GET", path, params=params)["lines"]
            return
        for doc in self._stream(path, params):
            if "line" in doc:
                yield str(doc["line"])

    def stacks(
        self, job: str, *, rank: int | None = None, native: bool = False
    ) -> list[dict[str, Any]]:
        """Each rank's stacks now (`rank`: that one), as its node's agent dumps them: a dict
        with rank, node, pid, stacks (py-spy's text) and error."""
        params: dict[str, Any] = {"native": native}
        if rank is not None:
            params["rank"] = rank
        found: list[dict[str, Any]] = self._call("GET", f"/v1/jobs/{job}/stacks", params=params)[
            "ranks"
        ]
        return found

    def events(self, job: str | None = None, *, last: int = 50) -> list[dict[str, Any]]:
        """The job's events (None: the pool's), the newest `last`."""
        path = f"/v1/jobs/{job}/events" if job else "/v1/events"
        found: list[dict[str, Any]] = self._call("GET", path, params={"last": last})["events"]
        return found

    # -- the pool -----------------------------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self._call("GET", "/v1/nodes")["nodes"]
        return rows

    def queues(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self._call("GET", "/v1/queues")["queues"]
        return rows

    def tokens(self) -> list[dict[str, Any]]:
        """Your API tokens not revoked (ids, expiry; never a secret)."""
        rows: list[dict[str, Any]] = self._call("GET", "/v1/tokens")["tokens"]
        return rows

    def revoke(self, token_id: str) -> str:
        """Revoke one of your tokens by its id ("all": every one of yours)."""
        return self._said("DELETE", f"/v1/tokens/{token_id}")

    # -- the wire -----------------------------------------------------------------------------

    def _said(self, method: str, path: str, **kw: Any) -> str:
        return str(self._call(method, path, **kw)["message"])

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        if method not in CHANGES:
            response = self._http.request(method, path, **kw)
        else:  # the same change each try: the pool takes it once
            headers = {**kw.pop("headers", {}), "Idempotency-Key": str(uuid.uuid4())}
            response = self._again(lambda: self._http.request(method, path, headers=headers, **kw))
        if response.is_error:
            raise _error(response)
        return response.json()

    @staticmethod
    def _again(send: Any) -> httpx.Response:
        """`send()`, again while the service cannot be reached or answers 503."""
        for attempt in range(1, TRIES + 1):
            try:
                response: httpx.Response = send()
            except httpx.TransportError:
                if attempt == TRIES:
                    raise
                time.sleep(attempt)
                continue
            if response.status_code != 503 or attempt == TRIES:
                return response
            after = response.headers.get("retry-after", "1")
            time.sleep(min(RETRY_AFTER_MAX_S, float(after) if after.isdigit() else 1.0))
        raise AssertionError("unreachable")

    def _stream(self, path: str, params: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """Server-sent events' data, as documents."""
        with self._http.stream("GET", path, params=params, timeout=None) as response:
            if response.is_error:
                response.read()
                raise _error(response)
            for line in response.iter_lines():
                if line.startswith("data: "):
                    yield json.loads(line[len("data: ") :])


def _error(response: httpx.Response) -> ApiError:
    try:
        doc = response.json()
        return ApiError(response.status_code, str(doc["title"]), str(doc["detail"]))
    except (ValueError, KeyError, TypeError):
        return ApiError(response.status_code, response.reason_phrase, response.text[:500])
