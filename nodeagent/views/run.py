"""A command run across a job's nodes (`nodeagentctl run`, as srun): one task a node, started by
each node's agent as the job's user (telemetry/runwire.py), their output line by line with the
node and task it came from, the caller's stdin fed to every task or one (srun's --input), the
signals the caller passes on, each task's end, and the worst of them. A node whose agent says
nothing for LOST_S (it beats every BEAT_S), or whose connection ends before its task's end, is
lost: its task counts as 255.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from nodeagent.errors import RefusedError, UsageError
from nodeagent.telemetry.logserve import Sign
from nodeagent.telemetry.runwire import (
    LOST_S,
    STDIN_CHUNK,
    RunOrder,
    RunRefused,
    RunStream,
    exit_status,
    run_payload,
)
from nodeagent.views.logs import Place, RankLogs

LOST = 255  # a task whose end nobody saw
FORBIDDEN = (401, 403)
INPUTS = ("all", "none")  # srun's --input, or a task's number


def fed_tasks(given: str, size: int) -> frozenset[int]:
    """The tasks of `size` whose stdin is the caller's: --input all, none, or a task's number.

    Raises:
        UsageError: none of those.
    """
    if given in INPUTS:
        return frozenset(range(size)) if given == "all" else frozenset()
    if not given.isdigit() or int(given) >= size:
        raise UsageError(f"--input {given}: all, none, or a task's number below {size}")
    return frozenset({int(given)})


@dataclass(frozen=True)
class Output:
    """A line a task wrote (its last may lack its newline); on a terminal, what it wrote as it
    came."""

    node: str
    rank: int
    text: str


@dataclass(frozen=True)
class Ended:
    """A task's end: its status as a shell says it, and in words."""

    node: str
    rank: int
    status: int
    said: str
    lost: bool = False


class Run:
    """Tasks started on the job's first `nodes` nodes (None: all), each its node's agent's."""

    def __init__(
        self,
        logs: RankLogs,
        argv: Sequence[str],
        nodes: int | None,
        env: Mapping[str, str],
        sign: Sign,
        window: tuple[int, int] | None = None,
        fed: str = "none",
    ) -> None:
        """Starts them all, or none; with `window` (rows, columns), on a terminal of that size
        each (run --pty: one node); the tasks `fed` names (`fed_tasks`) read the stdin `feed`
        gives them, the others' is closed.

        Raises:
            NotFoundError: no such job. RefusedError: a node refused the caller.
            UsageError: the job has fewer nodes, a node cannot be reached or cannot start it.
        """
        _, places = logs.members()
        if nodes is not None and not 0 < nodes <= len(places):
            raise UsageError(f"--nodes {nodes}: job {logs.job} has {len(places)} nodes now")
        places = places[:nodes] if nodes is not None else places
        unreachable = [p for p in places if isinstance(p, str)]
        if unreachable or not places:
            raise UsageError("; ".join(unreachable) or f"job {logs.job} has no nodes now")
        asked = [p for p in places if isinstance(p, Place)]
        feeding = fed_tasks(fed, len(asked)) if window is None else frozenset()
        orders = [
            RunOrder(tuple(argv), i, len(asked), dict(env), window, i in feeding)
            for i in range(len(asked))
        ]
        self._raw = window is not None
        with ThreadPoolExecutor(len(asked), thread_name_prefix="run-open") as pool:
            opened = list(pool.map(lambda p, o: _open(logs.job, p, o, sign), asked, orders))
        failed = [o for o in opened if not isinstance(o, RunStream)]
        if failed:
            for stream in opened:
                if isinstance(stream, RunStream):
                    stream.close()  # its agent hangs its task up
            refused = [f for f in failed if isinstance(f, RefusedError)]
            raise refused[0] if refused else failed[0]
        self.tasks = [(p.node, o.rank) for p, o in zip(asked, orders, strict=True)]
        self._streams = [s for s in opened if isinstance(s, RunStream)]
        self._fed = [s for s, o in zip(self._streams, orders, strict=True) if o.stdin]
        self._events: queue.Queue[Output | Ended] = queue.Queue()
        for (node, rank), stream in zip(self.tasks, self._streams, strict=True):
            reader = threading.Thread(
                target=self._read, args=(node, rank, stream), name=f"run-{node}", daemon=True
            )
            reader.start()

    def events(self, poll_s: float = 0.2) -> Iterator[Output | Ended | None]:
        """Each line and each end as it comes, until every task ended; None after `poll_s`
        with nothing (a face's moment to act on a signal it was sent)."""
        left = len(self._streams)
        while left:
            try:
                event = self._events.get(timeout=poll_s)
            except queue.Empty:
                yield None
                continue
            left -= isinstance(event, Ended)
            yield event

    def signal(self, name: str) -> None:
        """Pass signal `name` (runwire.SIGNALS) on to every task."""
        for stream in self._streams:
            stream.signal(name)

    def type(self, data: bytes) -> None:
        """What is typed, to every task's terminal."""
        for stream in self._streams:
            stream.type(data)

    def feed(self, read: Callable[[int], bytes]) -> None:
        """The fed tasks' stdin: what `read(n)` gives (at most n bytes; b"" at its end), each
        chunk sent once every fed task still running has room for it (RunStream.feed), then
        its end. Blocks: a thread of the caller's."""
        streams = list(self._fed)
        while streams:
            data = read(STDIN_CHUNK)
            if not data:
                break
            streams = [s for s in streams if s.feed(data)]  # one that ended takes no more
        for stream in streams:
            stream.end_input()

    def resize(self, rows: int, columns: int) -> None:
        for stream in self._streams:
            stream.resize(rows, columns)

    def close(self) -> None:
        """Leave: every task still running is hung up by its agent."""
        for stream in self._streams:
            stream.close()

    def _read(self, node: str, rank: int, stream: RunStream) -> None:
        partial = ""
        try:
            for doc in stream.frames():
                if "took" in doc and isinstance(doc["took"], int):
                    stream.took(doc["took"], doc.get("closed") is True)
                elif "out" in doc and self._raw:
                    self._events.put(Output(node, rank, str(doc["out"])))
                elif "out" in doc:
                    *lines, partial = (partial + str(doc["out"])).split("\n")
                    for line in lines:
                        self._events.put(Output(node, rank, line))
                elif "exit" in doc or "signal" in doc or "error" in doc:
                    if partial:
                        self._events.put(Output(node, rank, partial))
                    stream.over()
                    self._events.put(_end(node, rank, doc))
                    return
            why = "its agent closed the connection before the task ended (did it restart?)"
        except TimeoutError:
            why = f"lost: its agent said nothing for {LOST_S:g} s"
        except (OSError, ValueError) as exc:
            why = f"lost: {exc}"
        why = stream.broken or why
        stream.over()
        if partial:
            self._events.put(Output(node, rank, partial))
        self._events.put(Ended(node, rank, LOST, why, lost=True))


def worst(ends: Sequence[Ended]) -> int:
    """The run's exit status: the worst of its tasks', as srun's."""
    return max((e.status for e in ends), default=0)


def _end(node: str, rank: int, doc: Mapping[str, object]) -> Ended:
    if "error" in doc:
        return Ended(node, rank, LOST, f"error: {doc['error']}")
    code = doc.get("exit")
    killed = doc.get("signal")
    status = exit_status(code if isinstance(code, int) else None, str(killed) if killed else None)
    said = f"killed by {killed}" if killed else f"exit {status}"
    return Ended(node, rank, status, said)


def _open(job: str, place: Place, order: RunOrder, sign: Sign) -> RunStream | Exception:
    where = f"node {place.node} at {place.address}"
    try:
        credential = sign(run_payload(job, place.node, order.body()))
        return RunStream.open(place.address, job, order, credential)
    except RunRefused as exc:
        if exc.code in FORBIDDEN:
            return RefusedError(f"{where}: {exc}", exc.code)
        if exc.code == 400 and order.stdin and "stdin" not in str(exc):
            return UsageError(
                f"{where}: {exc}: its agent is older and feeds no task's stdin: upgrade it, "
                "or give --input none"
            )
        return UsageError(f"{where}: {exc}")
    except OSError as exc:
        return UsageError(f"{where}: unreachable: {exc} (is its metrics.listen reachable?)")
