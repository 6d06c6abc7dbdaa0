"""read_error_file: the root cause a rank wrote under @record, and nothing from garbage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeagent.supervisor.errorfile import MAX_CAUSE_CHARS, MAX_FILE_BYTES, read_error_file

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/venv/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367,'
    " in wrapper\n    return f(*args, **kwargs)\n"
    '  File "/jobs/train.py", line 42, in main\n    raise ValueError("bad batch size 0")\n'
    "ValueError: bad batch size 0\n"
)
RECORDED = {
    "message": {
        "message": "ValueError: bad batch size 0",
        "extraInfo": {"py_callstack": TRACEBACK, "timestamp": "1795351926"},
    }
}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (json.dumps(RECORDED), "ValueError: bad batch size 0 (at /jobs/train.py:42 in main)"),
        (
            json.dumps({"message": {"message": "RuntimeError: multi\nline", "extraInfo": {}}}),
            "RuntimeError: multi line",
        ),
        (json.dumps({"message": "SignalException: SIGTERM"}), "SignalException: SIGTERM"),
        (json.dumps({"message": {"message": "", "extraInfo": {}}}), None),
        (json.dumps({"message": 3}), None),
        (json.dumps([1, 2]), None),
        ("{not json", None),
        ("", None),
        (b"\xff\xfe", None),
    ],
    ids=[
        "recorded",
        "multiline",
        "plain-message",
        "empty",
        "number",
        "list",
        "broken",
        "blank",
        "binary",
    ],
)
def test_read_error_file(tmp_path: Path, content: str | bytes, expected: str | None) -> None:
    path = tmp_path / "error.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    assert read_error_file(path) == expected


def test_missing_file_is_no_cause(tmp_path: Path) -> None:
    assert read_error_file(tmp_path / "absent.json") is None


def test_oversized_file_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": "E: " + "x" * MAX_FILE_BYTES}))
    assert read_error_file(path) is None


def test_long_message_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": "E: " + "y" * 5000}))
    cause = read_error_file(path)
    assert cause is not None and len(cause) == MAX_CAUSE_CHARS and cause.endswith("...")


def test_written_by_torch_record(tmp_path: Path) -> None:
    """The file torch itself writes under @record reads back as type, message and location."""
    errors = pytest.importorskip("torch.distributed.elastic.multiprocessing.errors")
    path = tmp_path / "error.json"
    handler = errors.ErrorHandler()
    monkey = pytest.MonkeyPatch()
    monkey.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    try:
        try:
            raise KeyError("missing-shard")
        except KeyError as exc:
            handler.record_exception(exc)
    finally:
        monkey.undo()
    cause = read_error_file(path)
    assert cause is not None
    assert cause.startswith("KeyError: 'missing-shard' (at ")
    assert "test_errorfile.py:" in cause and "in test_written_by_torch_record" in cause
