"""The API service under load: read latency, submission latency and sustained submissions a
second, through the API and through the CLI's path, as the pool grows to 10,000 jobs.

    .venv/bin/python bench/api.py [--nodes 1000] [--sizes 100,1000,10000] [--clients 100]

On this machine: a private redis-server, a munged with a fresh key, one real agent (`nodeagent
run`, pool.auth munge, a token key) that leads a pool of --nodes nodes (the others simulated:
their reports written with long leases; every benchmark job asks for more nodes than the pool
has, so it stays pending: the pool leader's work is the requests and the queue, not
placements), and `nodeagent api` on its Unix socket. The load: --clients concurrent clients
(asyncio, httpx), each with the same operator's API token (`nodeagentctl token` as root), the
service's per-user rate set out of the way.

For each size S: submissions through the API until the pool holds S jobs, each one's latency
until the pool leader's answer: the first half as fast as the clients get answers (a closed
loop: the most submissions a second; its latency is then about clients / rate, Little's law),
the second half offered at --rate a second whatever the answers' pace (an open loop, as wrk2
offers it: a submission waiting for a free connection counts its wait), then
reads by the same clients: `GET /v1/jobs/{job}` (show, with goodput), `GET /v1/nodes`,
`GET /v1/queues`, `GET /v1/jobs?state=running` (every job's status read, one row back).
Then the CLI's path at the last size: what `nodeagentctl submit` sends, a request signed by
libmunge and appended to the requests stream, from --clients threads each waiting for its
answer's event, without the CLI's own start-up. At the end every accepted submission is
counted in the pool (none lost). Medians and p99 in ms; everything (clients, service, agent,
Redis, munged) shares this machine's cores. Writes bench/results/api.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.api.answers import Answers  # noqa: E402
from nodeagent.coord.client import connect  # noqa: E402
from nodeagent.coord.keys import PoolKeys  # noqa: E402
from nodeagent.coord.pool import PoolStore  # noqa: E402
from nodeagent.coord.requests import RequestStore  # noqa: E402
from nodeagent.model.pool import PoolNode  # noqa: E402
from nodeagent.model.request import Reply, Request, Verb  # noqa: E402
from nodeagent.supervisor.libmunge import munge_at  # noqa: E402
from tests.helpers.cluster import RedisServer, start_agent, wait_for  # noqa: E402
from tests.helpers.munge import MungeDaemon  # noqa: E402

POOL = "bench"
CTL = [sys.executable, "-m", "nodeagent.cli.ctl"]
LEASE_MS = 3_600_000
NEVER = 100_000  # nodes a benchmark job needs: more than the pool has, so it stays pending


def spec(job: str) -> dict[str, Any]:
    return {"id": job, "entrypoint": ["true"], "min_nodes": NEVER, "max_nodes": NEVER}


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(p99 * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
        "count": len(ordered),
    }


class Connection:
    """A plain HTTP/1.1 keep-alive connection over the service's socket, as thin as a client
    can be (a load generator in Python must not be what is measured: httpx costs more CPU per
    request than the service does)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str):
        self._reader = reader
        self._writer = writer
        self._auth = f"Authorization: Bearer {token}\r\n"

    @classmethod
    async def open(cls, socket: str, token: str) -> Connection:
        reader, writer = await asyncio.open_unix_connection(socket, limit=1 << 24)
        return cls(reader, writer, token)

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else b""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: api\r\n{self._auth}"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        self._writer.write(head.encode() + data)
        status_line = await self._reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, await self._reader.readexactly(length)

    def close(self) -> None:
        self._writer.close()


class Bench:
    def __init__(self, directory: Path, nodes: int, clients: int) -> None:
        self.directory = directory
        self.nodes = nodes
        self.clients = clients
        self.redis = RedisServer(directory)
        self.munged = MungeDaemon()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.socket = str(directory / "api.sock")
        self.submitted = 0

    def start(self) -> None:
        self.redis.start()
        self.munged.start()
        key = self.directory / "token.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(os.urandom(32).hex())
        config = {
            "node": {"name": "n00000", "address": "127.0.0.1"},
            "redis": {"url": self.redis.url},
            "pool": {
                "name": POOL,
                "auth": "munge",
                "munge_socket": self.munged.socket,
                "tokens": {"key_file": str(key)},
                "allow_root": True,
            },
            "metrics": {"listen": "127.0.0.1:0"},
            "log_dir": str(self.directory / "logs"),
            "state_dir": str(self.directory / "state"),
        }
        path = self.directory / "agent.yaml"
        path.write_text(yaml.safe_dump(config))
        self.procs.append(start_agent("n00000", path, self.directory).proc)
        self.store = PoolStore(connect(self.redis.url, 30.0), PoolKeys("nodeagent", POOL))
        requests = RequestStore(self.store.client, self.store.keys)
        wait_for(lambda: requests.auth() == "munge", 60, "the agent leading the pool")
        self._simulate_nodes()
        api = {
            "redis": {"url": self.redis.url},
            "pool": POOL,
            "munge_socket": self.munged.socket,
            "socket": self.socket,
            "limits": {"requests_per_second": 100000, "burst": 100000, "connections": 4096},
        }
        (self.directory / "api.yaml").write_text(yaml.safe_dump(api))
        log = (self.directory / "api.log").open("wb")
        command = [sys.executable, "-m", "nodeagent", "api", "--config"]
        self.procs.append(
            subprocess.Popen(
                [*command, str(self.directory / "api.yaml")], stdout=log, stderr=subprocess.STDOUT
            )
        )
        wait_for(lambda: Path(self.socket).exists(), 60, "the API service's socket")
        where = ["--redis", self.redis.url, "--pool", POOL, "--munge-socket", self.munged.socket]
        minted = subprocess.run(
            [*CTL, *where, "token", "--lifetime", "1h"],
            capture_output=True,
            text=True,
            check=True,
        )
        self.token = minted.stdout.strip()

    def _simulate_nodes(self) -> None:
        reports = [
            PoolNode(
                name=f"n{i:05d}",
                address="10.0.0.1",
                lease_ttl_ms=LEASE_MS,
                labels={"gpu": "h100"},
                metrics="10.0.0.1:9410",
                version="bench",
            )
            for i in range(1, self.nodes)
        ]
        for i in range(0, len(reports), 1000):
            self.store.sync_many(reports[i : i + 1000])

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.munged.stop()
        self.redis.stop()

    async def load(
        self, count: int, call: Callable[[Connection, int], Awaitable[tuple[int, bytes]]]
    ) -> tuple[list[float], float, int]:
        """`count` calls by `clients` concurrent clients, each on a connection of its own: each
        call's latency, the wall time, and how many were not answered 2xx."""
        latencies: list[float] = []
        failed = 0
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(count):
            queue.put_nowait(i)

        async def client(connection: Connection) -> None:
            nonlocal failed
            while not queue.empty():
                i = queue.get_nowait()
                began = time.perf_counter()
                status, body = await call(connection, i)
                latencies.append(time.perf_counter() - began)
                if not 200 <= status < 300:
                    failed += 1
                    if failed <= 3:
                        print(f"  {status}: {body[:300]!r}", flush=True)

        connections = [await Connection.open(self.socket, self.token) for _ in range(self.clients)]
        try:
            began = time.perf_counter()
            await asyncio.gather(*(client(c) for c in connections))
            wall = time.perf_counter() - began
        finally:
            for connection in connections:
                connection.close()
        return latencies, wall, failed

    async def at_rate(
        self,
        count: int,
        rate: float,
        call: Callable[[Connection, int], Awaitable[tuple[int, bytes]]],
    ) -> tuple[list[float], float, int]:
        """`count` calls offered at `rate` a second whatever the answers' pace (an open loop, as
        wrk2 offers it), each on whichever of the `clients` connections is free: each call's
        latency from the moment it was due, so that a call kept waiting for a free connection
        counts its wait too; the wall time, and how many were not answered 2xx."""
        latencies: list[float] = []
        failed = 0
        free: asyncio.Queue[Connection] = asyncio.Queue()
        connections = [await Connection.open(self.socket, self.token) for _ in range(self.clients)]
        for connection in connections:
            free.put_nowait(connection)

        async def one(i: int, due: float) -> None:
            nonlocal failed
            connection = await free.get()
            status, body = await call(connection, i)
            latencies.append(time.perf_counter() - due)
            free.put_nowait(connection)
            if not 200 <= status < 300:
                failed += 1
                if failed <= 3:
                    print(f"  {status}: {body[:300]!r}", flush=True)

        calls: list[asyncio.Task[None]] = []
        try:
            began = time.perf_counter()
            for i in range(count):
                due = began + i / rate
                if (wait := due - time.perf_counter()) > 0:
                    await asyncio.sleep(wait)
                calls.append(asyncio.create_task(one(i, due)))
            await asyncio.gather(*calls)
            wall = time.perf_counter() - began
        finally:
            for connection in connections:
                connection.close()
        return latencies, wall, failed

    async def submit_until(self, size: int, rate: float) -> dict[str, Any]:
        """Submissions until the pool holds `size` jobs: the first half as fast as the clients
        get answers (a closed loop: the most a second), the second half offered at `rate`."""
        first, count = self.submitted, size - self.submitted
        closed = count // 2

        async def submit(c: Connection, i: int) -> tuple[int, bytes]:
            return await c.request("POST", "/v1/jobs", {"spec": spec(f"api-{first + i:06d}")})

        async def submit_later(c: Connection, i: int) -> tuple[int, bytes]:
            return await submit(c, closed + i)

        latencies, wall, failed = await self.load(closed, submit)
        most = {"submitted": closed, "failed": failed, "per_s": round(closed / wall, 1)}
        latencies_at, wall_at, failed_at = await self.at_rate(count - closed, rate, submit_later)
        self.submitted = size
        offered = {
            "offered_per_s": rate,
            "submitted": count - closed,
            "failed": failed_at,
            "per_s": round((count - closed) / wall_at, 1),
        }
        return {
            "at_most": {**most, **percentiles(latencies)},
            "at_rate": {**offered, **percentiles(latencies_at)},
        }

    async def reads(self, count: int) -> dict[str, Any]:
        some = f"api-{self.submitted // 2:06d}"
        paths = {
            "show": f"/v1/jobs/{some}",
            "nodes": "/v1/nodes",
            "queues": "/v1/queues",
            "jobs?state=running": "/v1/jobs?state=running",
        }
        found: dict[str, Any] = {}
        for name, path in paths.items():

            async def read(c: Connection, i: int, path: str = path) -> tuple[int, bytes]:
                return await c.request("GET", path)

            latencies, wall, failed = await self.load(count, read)
            found[name] = {"failed": failed, "per_s": round(count / wall, 1)}
            found[name].update(percentiles(latencies))
        return found

    def cli_path(self, count: int) -> dict[str, Any]:
        """What nodeagentctl submit sends, from `clients` threads: signed by munge (libmunge,
        as nodeagentctl), appended, answered by the pool leader. Each waits for its answer as
        nodeagentctl does, woken by the answer's event; one follower of the stream wakes them
        all (api/answers.py), so that 100 waiters here do not cost what 100 nodeagentctl on
        their own hosts would not."""
        munge = munge_at(self.munged.socket)  # as nodeagentctl signs
        requests = RequestStore(self.store.client, self.store.keys)
        answers = Answers(self.store, requests)
        answers.start()  # following the stream before the first request is sent
        first = self.submitted

        def one(i: int) -> tuple[float, bool]:
            began = time.perf_counter()
            body = {"spec": {**spec(f"cli-{first + i:06d}"), "user": "root"}}
            request = Request(POOL, Verb.SUBMIT, body)
            request = replace(request, credential=munge.encode(request.payload))
            request_id = requests.send(request)
            got: list[Reply] = []
            done = threading.Event()

            def deliver(reply: Reply) -> None:
                got.append(reply)
                done.set()

            reply = None
            if answers.expect(request_id, deliver):  # else: answered already
                while not done.wait(1.0) and reply is None:  # a wake missed: a second's poll
                    reply = requests.reply(request_id)
            answers.forget(request_id)
            reply = got[0] if got else reply or requests.reply(request_id)
            return time.perf_counter() - began, reply is not None and reply.ok

        began = time.perf_counter()
        with ThreadPoolExecutor(self.clients) as pool:
            done = list(pool.map(one, range(count)))
        wall = time.perf_counter() - began
        answers.close()
        self.submitted += count
        return {
            "submitted": count,
            "failed": sum(not ok for _, ok in done),
            "per_s": round(count / wall, 1),
            "threads": self.clients,
            **percentiles([t for t, _ in done]),
        }

    def lost(self) -> dict[str, int]:
        jobs = self.store.read().jobs
        return {"accepted": self.submitted, "in_the_pool": len(jobs)}


async def measure(bench: Bench, sizes: list[int], reads: int, rate: float) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        submitted = await bench.submit_until(size, rate)
        row = {"jobs": size, "api_submit": submitted, "reads": await bench.reads(reads)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument(
        "--reads",
        type=int,
        default=20_000,
        help="requests per read, per size (each read's first, which waits for its first "
        "answer to be made, is among them)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=500.0,
        help="submissions a second offered in each size's second half (Slurm's published 500)",
    )
    parser.add_argument("--cli", type=int, default=1000, help="submissions on the CLI's path")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "api.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        bench = Bench(Path(tmp), args.nodes, args.clients)
        try:
            bench.start()
            rows = asyncio.run(measure(bench, sizes, args.reads, args.rate))
            cli = bench.cli_path(args.cli)
            print(json.dumps({"cli_path": cli}), flush=True)
            time.sleep(2)  # the last answers are written; the pool read after them
            counted = bench.lost()
            print(json.dumps(counted), flush=True)
        finally:
            bench.stop()
    result = {
        "what": "bench/api.py",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "nodes": args.nodes,
        "clients": args.clients,
        "offered_per_s": args.rate,
        "sizes": rows,
        "cli_path": cli,
        "counted": counted,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
