"""Structured log lines: every one stamped with node, job and generation."""

from __future__ import annotations

import io
import json
import logging

from nodeagent.telemetry import logs
from nodeagent.telemetry.logs import LogContext, WorkerEcho


def emit(fmt: str, context: LogContext) -> str:
    stream = io.StringIO()
    logs.configure(fmt, "INFO", context, stream)
    logging.getLogger("nodeagent.test").info('worker %d exited with "code" %d', 3, 1)
    logging.getLogger().handlers.clear()
    return stream.getvalue().strip()


def test_key_value_lines() -> None:
    context = LogContext("gpu-node-01", "llama", 7)
    line = emit("text", context)
    assert " level=INFO logger=nodeagent.test node=gpu-node-01 job=llama gen=7 " in line
    assert line.endswith('msg="worker 3 exited with \\"code\\" 1"')
    assert line.startswith("ts=20")


def test_json_lines_follow_the_context() -> None:
    context = LogContext("n1", "llama")
    context.generation = 12
    data = json.loads(emit("json", context))
    assert {k: data[k] for k in ("level", "node", "job", "generation")} == {
        "level": "INFO",
        "node": "n1",
        "job": "llama",
        "generation": 12,
    }
    assert data["msg"] == 'worker 3 exited with "code" 1'


def test_worker_lines_are_stamped_too() -> None:
    context = LogContext("n1", "llama", 4)
    out = io.StringIO()
    clock = (1_700_000_000.25).__float__  # 2023-11-14T22:13:20.250Z
    WorkerEcho("text", context, out, clock)(5, "loss 0.3")
    WorkerEcho("json", context, out, clock)(5, "loss 0.2")
    text, js = out.getvalue().splitlines()
    assert text == "ts=2023-11-14T22:13:20.250Z node=n1 job=llama gen=4 [rank 5]: loss 0.3"
    assert json.loads(js)["rank"] == 5 and json.loads(js)["generation"] == 4
    assert json.loads(js)["ts"] == "2023-11-14T22:13:20.250Z"
