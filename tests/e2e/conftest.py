"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def shm(job_id: str) -> Iterator[Path]:
    """A memory_dir on the real tmpfs, gone afterwards whatever happened. Its own to this
    process: job ids repeat across pytest-xdist workers (a per-process counter), and two
    tests sharing one would write over each other's saves."""
    path = Path("/dev/shm") / f"nodeagent-test-{job_id}-{os.getpid()}"
    yield path
    shutil.rmtree(path, ignore_errors=True)
