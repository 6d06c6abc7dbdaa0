"""Who the workers of the tests' agents run as: whoever runs the tests, said explicitly.

An agent that runs as root needs job.user (the default, the `nodeagent` system user, is not on
a test machine) and, for root workers, job.allow_root: true. An agent that is not root runs its
workers as itself, and naming itself is allowed (job.allow_root then changes nothing).
"""

from __future__ import annotations

import os
import pwd

# Spread into a job section: {"job": {"id": ..., **AS_TESTER}}.
AS_TESTER: dict[str, str | bool] = {
    "user": pwd.getpwuid(os.geteuid()).pw_name,
    "allow_root": True,
}
