"""A failed rank's root cause from its torchelastic error file. Pure apart from one bounded read.

A worker whose entrypoint is decorated with `torch.distributed.elastic.multiprocessing.errors.
record` writes the exception it died of to $TORCHELASTIC_ERROR_FILE (launch.error_file_path):
`{"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack": "Traceback ...",
"timestamp": "..."}}}`. torchrun prints that as the root cause of the job's failure; nodeagent
makes the same line part of the failure. The file is the worker's, so it is untrusted: a missing,
oversized or malformed file is no root cause (None), never an error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

MAX_FILE_BYTES = 256 * 1024  # a deep traceback fits; anything larger is not read
MAX_CAUSE_CHARS = 500  # what a failure's detail carries at most
_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>\S+)\s*$')


def read_error_file(path: str | Path) -> str | None:
    """ "ValueError: bad batch (at train.py:42 in main)": the exception's type and message and
    the innermost frame of its traceback; None when the rank wrote no usable error file."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_FILE_BYTES:
        return None
    try:
        data = json.loads(raw.decode("utf-8", errors="replace"))
    except ValueError:
        return None
    return describe_error(data)


def describe_error(data: object) -> str | None:
    """The root-cause line from an error file's parsed JSON (see read_error_file)."""
    if not isinstance(data, dict):
        return None
    message = data.get("message")
    callstack: object = None
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        callstack = extra.get("py_callstack") if isinstance(extra, dict) else None
        message = message.get("message")
    if not isinstance(message, str) or not message.strip():
        return None
    text = " ".join(message.split())
    where = _innermost_frame(callstack) if isinstance(callstack, str) else None
    cause = f"{text} (at {where})" if where else text
    return cause if len(cause) <= MAX_CAUSE_CHARS else cause[: MAX_CAUSE_CHARS - 3] + "..."


def _innermost_frame(callstack: str) -> str | None:
    """`file:line in function` of the last frame of a Python traceback."""
    found = None
    for line in callstack.splitlines():
        match = _FRAME_RE.match(line)
        if match:
            found = f"{match['file']}:{match['line']} in {match['func']}"
    return found
