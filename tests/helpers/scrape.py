"""Reading an agent's /metrics over HTTP into samples."""

from __future__ import annotations

import os
import pwd
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


AGENT_USER = pwd.getpwuid(os.geteuid()).pw_name  # whom a test's job runs as: the agent's user


def job_labels(job_id: str, **more: str) -> tuple[tuple[str, str], ...]:
    """A per-job sample's labels as `scrape` keys them: its job, the user the job runs as
    (every per-job series carries it), and `more`."""
    return tuple(sorted({"job_id": job_id, "user": AGENT_USER, **more}.items()))
