"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def shm(job_id: str) -> Iterator[Path]:
    """A memory_dir on the real tmpfs, gone afterwards whatever happened."""
    path = Path("/dev/shm") / f"nodeagent-test-{job_id}"
    yield path
    shutil.rmtree(path, ignore_errors=True)
