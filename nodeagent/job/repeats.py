"""A failure that repeats the one before it: said in the job's status and events. Pure.

A script that cannot run at the new world size (PyTorch Lightning's `Trainer(num_nodes=3)`
after a node loss: "the product (1 * 3) does not match the world size (2)") fails the same way
generation after generation until the restart budget is gone; saying so points at the script,
not at the nodes.
"""

from __future__ import annotations

from nodeagent.model.job import Failure

SAME_CAUSE = (
    "the same error as the failure before it: restarting will not fix it (a script that fixes "
    "its world size? docs/worker.md, 'Frameworks that fix the world size')"
)


def root(cause: str) -> str:
    """The line that names an error: the last of a failure's cause (its last output lines are
    joined with " | "; an exception's message is one)."""
    return cause.rsplit(" | ", 1)[-1].strip()


def describe(failure: Failure, previous_detail: str) -> str:
    """`failure.describe()`, saying so when its error is the one `previous_detail` (the job's
    detail: the failure before) names."""
    text = failure.describe()
    error = root(failure.cause) if failure.cause else ""
    if error and error in previous_detail:
        return f"{text}; {SAME_CAUSE}"
    return text
