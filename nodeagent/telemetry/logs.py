"""Structured logs for journald and log shippers: key=value text or one JSON object a line.

Every line, the agent's and its workers' (echoed), carries node, job and generation. The values
come from a small context the agent keeps current; a logging.Filter stamps them on each record.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

FORMATS = ("text", "json")


@dataclass
class LogContext:
    """What every line is stamped with; the agent updates `generation`."""

    node: str
    job: str
    generation: int = 0


class ContextFilter(logging.Filter):
    def __init__(self, context: LogContext) -> None:
        super().__init__()
        self._context = context

    def filter(self, record: logging.LogRecord) -> bool:
        """Stamp the context, where a line does not name its own job (`extra={"job": ...}`:
        the pool leader's notice of another job is that job's line, not its node's)."""
        record.node = self._context.node
        if "job" not in record.__dict__:
            record.job = self._context.job
            record.generation = self._context.generation
        elif "generation" not in record.__dict__:
            record.generation = 0
        return True


def _quote(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n'):
        return json.dumps(text)
    return text


def _timestamp(created: float) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        + f".{int(created % 1 * 1000):03d}Z"
    )


def _fields(record: logging.LogRecord) -> dict[str, object]:
    """What every line says, in the order it says it."""
    return {
        "ts": _timestamp(record.created),
        "level": record.levelname,
        "logger": record.name,
        "node": getattr(record, "node", None),
        "job": getattr(record, "job", None),
        "generation": getattr(record, "generation", None),
        "msg": record.getMessage(),
    }


class KeyValueFormatter(logging.Formatter):
    """ts=... level=INFO logger=nodeagent.job.agent node=a job=llama gen=3 msg="...\""""

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        fields["gen"] = fields.pop("generation") or 0
        fields["msg"] = fields.pop("msg")  # last, after gen
        line = " ".join(f"{k}={_quote('-' if v is None else v)}" for k, v in fields.items())
        if record.exc_info:
            line += " exc=" + _quote(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = _fields(record)
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data)


def configure(fmt: str, level: str, context: LogContext, stream: TextIO = sys.stderr) -> None:
    """Install the handler on the root logger (the daemon's only logging set-up)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    handler.addFilter(ContextFilter(context))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class WorkerEcho:
    """Writes worker output lines to stdout whole, stamped like the agent's own lines: the
    time the agent read the line, node, job, generation and rank."""

    def __init__(
        self,
        fmt: str,
        context: LogContext,
        stream: TextIO = sys.stdout,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._fmt = fmt
        self._context = context
        self._stream = stream
        self._lock = threading.Lock()

    def __call__(self, rank: int, line: str) -> None:
        c = self._context
        ts = _timestamp(self._clock())  # when the agent read the line
        if self._fmt == "json":
            text = json.dumps(
                {
                    "ts": ts,
                    "node": c.node,
                    "job": c.job,
                    "generation": c.generation,
                    "rank": rank,
                    "msg": line,
                }
            )
        else:
            text = f"ts={ts} node={c.node} job={c.job} gen={c.generation} [rank {rank}]: {line}"
        with self._lock:
            self._stream.write(text + "\n")
            self._stream.flush()
