"""Checkpoint commit latency: a save -> the leader's record names it committed (issue 41).

    .venv/bin/python bench/commit_latency.py --heartbeats 0.25,1 --sizes 40MB,1GB --saves 12 \
        --out bench/results/commit-latency.json

Four agents on this machine and a real redis-server (and a munged: the checkpoint plane
authenticated as it runs on a pool), one worker each, run examples/train_fsdp.py (FSDP2, gloo,
CPU) with `replicas: 1`: each node keeps its rank's saves in its memory tier and copies each to
its successor on the ring; the leader records a save committed once every rank of it is held on
2 live nodes (job/checkpoints/replication.py). The script's --digest is dropped: its gathered
SHA-256 of the whole state would delay the "saved" line. One job per (heartbeat, size), lease
3 s at a heartbeat of 250 ms (the end-to-end tests' timing) and 5 s at 1 s.

While the job runs, a thread samples every POLL_S, on this machine's clock:
- the job record (the committed step) and every node's report (what it says its memory tier
  and replica area hold): the first sample that shows each;
- every manifest in the nodes' memory tiers and replica areas (`<memory_dir>/<node>.<job>` and
  `+replicas`): its mtime, written last, is when a rank's save was written (memory tier) and
  when its copy landed on the peer (replica area: checkpoint/transport.py writes the manifest
  last).
And a second thread follows Redis' MONITOR for the copies hash: when the leader's HAND_OUT
wrote a share naming each rank's copy (its HSET), and when each node read its share (HGET).
Per save step after WARMUP saves, from rank 0's and every rank's `saved` lines:
- save -> committed: from the last rank's "saved" line to the first sample of the record that
  names this step (or a newer one) committed;
- copy landed -> committed: from the last of its copies landing (replica manifest mtime);
- the stages between, each when the last rank reached it, in seconds after the last "saved"
  line: written (memory manifests), reported (every node's report holds its rank's save),
  handed (a share names every rank's copy), read_before (the senders' last reads of their
  shares before that), share_read (every sender read that share),
  landed (every copy's manifest), copies_reported (the receivers' reports hold them),
  committed_at;
- skipped: steps the workers did not write (their `skipped` lines, channel/pin.py), and steps
  written but never committed (a newer one was committed first: `overtaken`).
Prints a table and writes the JSON (with the load average at the start and end of each run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.channel.manifests import BadCopy, Manifest  # noqa: E402
from nodeagent.coord.keys import JobKeys  # noqa: E402
from nodeagent.model.job import JobRecord, NodeReport  # noqa: E402
from tests.helpers.cluster import LocalCluster, RedisServer, wait_for  # noqa: E402
from tests.helpers.fsdp import TIMING, fsdp_cluster, lines  # noqa: E402
from tests.helpers.munge import MungeDaemon  # noqa: E402

NODES = ("a", "b", "c", "d")
EVERY = 5  # steps between saves
WARMUP = 2  # saves not counted: the agents' first reads, the first copies
POLL_S = 0.02
LEASES = {0.25: "3s", 1.0: "5s"}  # heartbeat -> lease_ttl
# size -> the script's model options and job.checkpoint.memory_size (two saves of a rank)
SIZES: dict[str, tuple[tuple[str, ...], str]] = {
    "40MB": (("--width", "512", "--layers", "14"), "256MiB"),
    "1GB": (("--width", "2304", "--layers", "16"), "1GiB"),
}
T = TypeVar("T")
STAGES = (
    "written",
    "reported",
    "handed",
    "read_before",
    "share_read",
    "landed",
    "copies_reported",
    "committed",
)


class Sampler:
    """Samples the job's Redis keys and the nodes' tiers every POLL_S on a thread (the module
    docstring); `first` maps (what, node, step, rank) to the first time it was seen."""

    def __init__(self, redis: RedisServer, job: str, shm: Path) -> None:
        self._client = redis.client()
        self._keys = JobKeys("nodeagent", job)
        self._job, self._shm = job, shm
        self._stop = threading.Event()
        self._mtimes: dict[Path, int] = {}
        self.first: dict[tuple[str, str, int, int], float] = {}
        self.committed: list[tuple[float, int, int]] = []  # (seen at, step, generation)
        self.sizes: dict[tuple[int, int], int] = {}  # (step, rank) -> bytes of the save
        self._decoded: dict[str, Any] = {}
        self.polls = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._redis()
                self._files()
                self.polls += 1
            except Exception as exc:  # a sample lost is said, the next one taken
                if len(self.errors) < 20:
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def _see(self, what: str, node: str, step: int, rank: int, at: float) -> None:
        self.first.setdefault((what, node, step, rank), at)

    def _redis(self) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.hget(self._keys.record, "record")
        pipe.mget([self._keys.node(n) for n in NODES])
        raw_record, raw_reports = pipe.execute()
        now = time.time()
        record = self._decode(raw_record, JobRecord.from_json)
        checkpoint = record.checkpoint if record is not None else None
        key = checkpoint.committed if checkpoint is not None else None
        if key is not None and (not self.committed or self.committed[-1][1:] != key[:2]):
            self.committed.append((now, key[0], key[1]))
        for name, raw in zip(NODES, raw_reports, strict=True):
            report = self._decode(raw, NodeReport.from_json)
            tier = report.tier if report is not None else None
            for what, held in (
                ("reported", tier.memory if tier else ()),
                ("copies_reported", tier.replicas if tier else ()),
            ):
                for save in held:
                    for rank in save.ranks:
                        self._see(what, name, save.step, rank, now)

    def _decode(self, raw: str | None, parse: Callable[[str], T]) -> T | None:
        """`raw` decoded, once for each value seen (the same value: the same object)."""
        if raw is None:
            return None
        if raw not in self._decoded:
            if len(self._decoded) > 10_000:
                self._decoded.clear()
            self._decoded[raw] = parse(raw)
        found: T = self._decoded[raw]
        return found

    def _files(self) -> None:
        for name in NODES:
            memory = self._shm / f"{name}.{self._job}"
            self._manifests("written", name, memory.glob("rank-*/slot-*/manifest.json"))
            replicas = Path(f"{memory}+replicas")
            self._manifests("landed", name, replicas.glob("*/rank-*/slot-*/manifest.json"))

    def _manifests(self, what: str, node: str, paths: Any) -> None:
        for path in paths:
            try:
                mtime = path.stat().st_mtime_ns
                if self._mtimes.get(path) == mtime:
                    continue
                manifest = Manifest.from_json(path.read_bytes(), str(path))
            except (OSError, BadCopy):
                continue  # being written or removed: the next sample
            self._mtimes[path] = mtime
            self._see(what, node, manifest.step, manifest.rank, mtime / 1e9)
            if what == "written":
                self.sizes[(manifest.step, manifest.rank)] = manifest.size


class Copies:
    """The leader's hand-outs and the nodes' reads of their shares, seen through Redis'
    MONITOR on a thread (server time: this machine's clock): `handed[(step, rank)]` is when a
    share first named that rank's copy and to whom (the HSET inside HAND_OUT), `reads[node]`
    when the node read its share (`HGET <copies> <node>`), in order."""

    def __init__(self, redis: RedisServer, job: str) -> None:
        self._client = redis.client()
        key = JobKeys("nodeagent", job).copies
        self._read = f'"HGET" "{key}" "'
        self._write = f'"HSET" "{key}" "'
        self._stop = threading.Event()
        self.handed: dict[tuple[int, int], tuple[float, str]] = {}
        self.reads: dict[str, list[float]] = {}
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="copies-monitor", daemon=True)

    def __enter__(self) -> Copies:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # the next command anyone sends wakes the thread
        self._thread.join(5)
        self._client.close()

    def _run(self) -> None:
        with self._client.monitor() as monitor:  # type: ignore[no-untyped-call]
            connection = monitor.connection
            while not self._stop.is_set():
                line = connection.read_response()
                text = line.decode(errors="replace") if isinstance(line, bytes) else str(line)
                try:
                    self._line(text)
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    if len(self.errors) < 20:
                        self.errors.append(f"{type(exc).__name__}: {exc}")

    def _line(self, text: str) -> None:
        at = float(text.split(" ", 1)[0])
        where = text.find(self._read)
        if where >= 0:
            node = text[where + len(self._read) :].split('"', 1)[0]
            self.reads.setdefault(node, []).append(at)
            return
        if text.find(self._write) < 0:
            return
        args = [a.replace('\\"', '"') for a in re.findall(r'"(.*?)(?<!\\)"', text)]
        for node, value in zip(args[2::2], args[3::2], strict=True):
            for transfer in json.loads(value)["transfers"]:
                step, _generation, _world, rank, *_rest, fetch = transfer
                if not fetch:
                    self.handed.setdefault((step, rank), (at, node))

    def read_after(self, node: str, t: float) -> float | None:
        return next((x for x in self.reads.get(node, ()) if x >= t), None)


def one(
    redis: RedisServer,
    munge_socket: str,
    directory: Path,
    heartbeat: float,
    size: str,
    saves: int,
) -> dict[str, Any]:
    """A fresh job at `heartbeat` and `size`, run until `saves` saves after WARMUP are
    committed or overtaken: what each save took."""
    model, memory_size = SIZES[size]
    shm = Path(tempfile.mkdtemp(prefix="nodeagent-commit-", dir="/dev/shm"))
    shm.chmod(0o700)
    job = f"bench-commit-{size.lower()}-{int(heartbeat * 1000)}ms"
    steps = [EVERY * (WARMUP + 1 + i) for i in range(saves)]
    load_start = os.getloadavg()
    began = time.time()
    try:
        with fsdp_cluster(
            redis,
            job,
            directory,
            shm,
            steps=100_000,
            nodes=len(NODES),
            replicas=1,
            every=EVERY,
            model=model,
            memory_size=memory_size,
            munge_socket=munge_socket,
        ) as cluster:
            cluster.timing = {
                **TIMING,
                "heartbeat_interval": f"{round(heartbeat * 1000)}ms",
                "lease_ttl": LEASES.get(heartbeat, f"{max(3.0, 5 * heartbeat):g}s"),
            }
            cluster.entrypoint = [a for a in cluster.entrypoint if a != "--digest"]
            cluster.min_nodes = len(NODES)  # the first generation runs every node
            with Copies(redis, job) as copies, Sampler(redis, job, shm) as sampler:
                cluster.start(*NODES)
                generation = cluster.wait_running(len(NODES), 120)["generation"]
                try:
                    wait_for(
                        lambda: _settled(cluster, generation, sampler, steps[-1]),
                        120 + 60 * saves,
                        "the saves",
                    )
                    ended = "settled"
                except AssertionError as exc:
                    ended = str(exc)
                time.sleep(0.2)
            cluster.ctl("stop")
            warnings = _agent_warnings(cluster)
            generations = cluster.status()["generation"]
            saves_found = _saves(cluster, generation, sampler, copies, steps)
    finally:
        shutil.rmtree(shm, ignore_errors=True)  # a run that failed too
    return {
        "heartbeat_s": heartbeat,
        "lease": cluster.timing["lease_ttl"],
        "size": size,
        "model": list(model),
        "state_bytes": _state_bytes(sampler),
        "wall_s": round(time.time() - began, 1),
        "load_start": [round(x, 2) for x in load_start],
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "generation": generation,
        "generation_at_end": generations,
        "ended": ended,
        "polls": sampler.polls,
        "sampler_errors": sampler.errors + copies.errors,
        "agent_warnings": warnings,
        "committed_seen": [[round(t, 3), s, g] for t, s, g in sampler.committed],
        "share_reads": {n: [round(t, 3) for t in ts] for n, ts in copies.reads.items()},
        "saves": saves_found,
        "summary": summary(saves_found),
    }


def _state_bytes(sampler: Sampler) -> int:
    """The bytes of the newest step every rank wrote (the four ranks' saves)."""
    by_step: dict[int, dict[int, int]] = {}
    for (step, rank), size in sampler.sizes.items():
        by_step.setdefault(step, {})[rank] = size
    whole = [sum(r.values()) for _s, r in sorted(by_step.items()) if len(r) == len(NODES)]
    return whole[-1] if whole else 0


def _settled(cluster: LocalCluster, generation: int, sampler: Sampler, last: int) -> bool:
    """The last counted step is committed (or a newer one), or the workers went 6 saves past
    it without."""
    if sampler.committed and sampler.committed[-1][1] >= last:
        return True
    said = lines(cluster, generation)
    found = [x["step"] for x in said if x["event"] in ("saved", "skipped")]
    return bool(found) and max(found) >= last + 6 * EVERY


def _saves(
    cluster: LocalCluster, generation: int, sampler: Sampler, copies: Copies, steps: list[int]
) -> list[dict[str, Any]]:
    said = lines(cluster, generation)
    ranks = sorted({x["rank"] for x in said if x["event"] == "restored"})
    found = []
    for step in steps:
        saved = {x["rank"]: x["t"] for x in said if x["event"] == "saved" and x["step"] == step}
        skipped = sorted(x["rank"] for x in said if x["event"] == "skipped" and x["step"] == step)
        seen = [(t, s) for t, s, g in sampler.committed if g == generation]
        at = next((t for t, s in seen if s >= step), None)
        exact = any(s == step for _t, s in seen)
        row: dict[str, Any] = {
            "step": step,
            "saved_rank0": saved.get(0),
            "saved_last": max(saved.values()) if len(saved) == len(ranks) else None,
            "skipped_ranks": skipped,
            "committed_at": at,
            "committed": exact,
        }
        for stage in ("written", "reported", "landed", "copies_reported"):
            row[stage] = _last_of(sampler, stage, step, ranks)
        row.update(_handed(copies, step, ranks))
        found.append(_relative(row))
    return found


def _last_of(sampler: Sampler, stage: str, step: int, ranks: list[int]) -> float | None:
    """When every rank of `step` had reached `stage` (the latest of the ranks' first times on
    any node; with replicas: 1 a rank's copy lands on one); None when a rank never did."""
    times = []
    for rank in ranks:
        seen = [t for (w, _n, s, r), t in sampler.first.items() if (w, s, r) == (stage, step, rank)]
        if not seen:
            return None
        times.append(min(seen))
    return max(times) if times else None


def _handed(copies: Copies, step: int, ranks: list[int]) -> dict[str, float | None]:
    """When a share first named every rank's copy of `step` (`handed`, the latest of the
    ranks), when every rank's sender had read it after (`share_read`), and the latest of the
    senders' last reads before it was written (`read_before`). None: a rank never was."""
    handed, before, after = [], [], []
    for rank in ranks:
        if (step, rank) not in copies.handed:
            return dict.fromkeys(("handed", "read_before", "share_read"))
        at, node = copies.handed[(step, rank)]
        handed.append(at)
        before.append(max((x for x in copies.reads.get(node, ()) if x < at), default=None))
        after.append(copies.read_after(node, at))
    return {
        "handed": max(handed),
        "read_before": _latest(before),
        "share_read": _latest(after),
    }


def _latest(times: list[float | None]) -> float | None:
    found = [t for t in times if t is not None]
    return max(found) if len(found) == len(times) else None


def _relative(row: dict[str, Any]) -> dict[str, Any]:
    """Each stage's time as seconds after the last rank's `saved` line (3 decimals)."""
    base = row["saved_last"]
    out = {k: v for k, v in row.items() if k in ("step", "skipped_ranks", "committed")}
    for key in ("saved_rank0", "committed_at", *STAGES[:-1]):
        value = row[key]
        out[key] = round(value - base, 3) if value is not None and base is not None else None
    out["saved_last_t"] = base
    out["save_to_commit_s"] = out["committed_at"] if row["committed"] else None
    landed = out["landed"]
    out["landed_to_commit_s"] = (
        round(out["committed_at"] - landed, 3)
        if row["committed"] and landed is not None and out["committed_at"] is not None
        else None
    )
    return out


def summary(saves: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and 95th percentiles over the committed saves; the saves skipped."""
    committed = [s for s in saves if s["save_to_commit_s"] is not None]
    result: dict[str, Any] = {
        "saves": len(saves),
        "committed": len(committed),
        "skipped_by_workers": sum(1 for s in saves if s["skipped_ranks"]),
        "overtaken": sum(1 for s in saves if not s["committed"] and not s["skipped_ranks"]),
    }
    for key in ("save_to_commit_s", "landed_to_commit_s", *STAGES[:-1]):
        values = sorted(s[key] for s in committed if s.get(key) is not None)
        result[key] = {"median": _q(values, 0.5), "p95": _q(values, 0.95), "n": len(values)}
    return result


def _q(values: list[float], q: float) -> float | None:
    """The q-quantile, linear between the closest ranks (None: no values)."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return round(statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1], 3)


def _agent_warnings(cluster: LocalCluster) -> dict[str, list[str]]:
    """The WARNING and ERROR lines of each agent's log, the first 20 of each (not the GPU
    monitor's: no NVML here)."""
    found = {}
    for name, agent in cluster.agents.items():
        bad = [
            line
            for line in agent.log().splitlines()
            if ("level=WARNING" in line or "level=ERROR" in line) and "nodeagent.gpu" not in line
        ]
        found[name] = bad[:20] + ([f"... {len(bad) - 20} more"] if len(bad) > 20 else [])
    return found


def table(runs: list[dict[str, Any]]) -> str:
    head = (
        "| heartbeat | state | save->commit median / p95 | landed->commit median / p95 "
        "| committed / saves | skipped by workers | overtaken |"
    )
    rows = [head, "|" + "---|" * 7]
    for run in runs:
        s = run["summary"]
        a, b = s["save_to_commit_s"], s["landed_to_commit_s"]
        rows.append(
            f"| {run['heartbeat_s']:g} s | {run['state_bytes'] / 1e6:.0f} MB "
            f"| {a['median']} / {a['p95']} s | {b['median']} / {b['p95']} s "
            f"| {s['committed']} / {s['saves']} | {s['skipped_by_workers']} | {s['overtaken']} |"
        )
    rows += ["", "medians, seconds after the last rank's saved line:", "| heartbeat | state | "]
    rows[-1] += " | ".join(STAGES[:-1]) + " | committed |"
    rows.append("|" + "---|" * (len(STAGES) + 2))
    for run in runs:
        s = run["summary"]
        cells = [str(s[k]["median"]) for k in (*STAGES[:-1], "save_to_commit_s")]
        rows.append(
            f"| {run['heartbeat_s']:g} s | {run['state_bytes'] / 1e6:.0f} MB | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heartbeats", default="0.25,1", help="seconds, comma-separated")
    parser.add_argument("--sizes", default="40MB,1GB", help=f"of {', '.join(SIZES)}")
    parser.add_argument("--saves", type=int, default=12, help="saves counted after the warm-up")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "commit-latency.json"))
    parser.add_argument("--note", default="", help="said in the JSON (what tree ran, say)")
    parser.add_argument("--commit", help="the commit measured (default: this checkout's HEAD)")
    args = parser.parse_args()
    heartbeats = [float(h) for h in args.heartbeats.split(",")]
    sizes = [s for s in args.sizes.split(",") if s in SIZES]
    commit = (
        args.commit
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "nodeagent"], capture_output=True, text=True, cwd=ROOT
    ).stdout.split("\n")
    found: dict[str, Any] = {
        "commit": commit or "(not a git checkout)",
        "root": str(ROOT),
        "note": args.note,
        "uncommitted_in_nodeagent": [line[3:] for line in dirty if line],
        "every_steps": EVERY,
        "warmup_saves": WARMUP,
        "poll_s": POLL_S,
        "runs": [],
    }
    path = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        redis.start()
        munged = MungeDaemon().start()
        try:
            for size in sizes:
                for heartbeat in heartbeats:
                    directory = Path(tmp) / f"{size}-{heartbeat:g}"
                    directory.mkdir()
                    run = one(redis, munged.socket, directory, heartbeat, size, args.saves)
                    found["runs"].append(run)
                    print(json.dumps({k: run[k] for k in ("heartbeat_s", "size", "summary")}))
                    print(f"  load {run['load_start']} -> {run['load_end']}, {run['wall_s']} s")
                    path.write_text(json.dumps(found, indent=1) + "\n")
        finally:
            munged.stop()
            redis.stop()
    print(table(found["runs"]))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
