"""The verbs, and the API route of each: one table both faces are held to.

`nodeagentctl`'s verb table (cli/ctl/verbs.py) has exactly these names, and the API (api/)
registers exactly these routes, each under its verb; tests/unit/test_faces.py fails when a verb
has no route or a route no verb. A verb a face cannot offer says so here, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    method: str  # GET, POST, PATCH, DELETE
    path: str  # under the API's root, with {job}, {node}, {rank}, {queue}, {token} parameters
    summary: str


ROUTES: Mapping[str, tuple[Route, ...]] = {
    # a job's own
    "status": (Route("GET", "/v1/jobs/{job}/status", "a job's status: its nodes, checkpoints"),),
    "scale": (Route("POST", "/v1/jobs/{job}/scale", "change a job's target size"),),
    "events": (
        Route("GET", "/v1/jobs/{job}/events", "a job's events (follow: streamed)"),
        Route("GET", "/v1/events", "the pool's events (follow: streamed)"),
    ),
    "restart": (Route("POST", "/v1/jobs/{job}/restart", "restart a job's workers"),),
    "stop": (Route("POST", "/v1/jobs/{job}/stop", "stop a pinned job"),),
    "cordon": (Route("POST", "/v1/nodes/{node}/cordon", "keep new work off a node"),),
    "drain": (Route("POST", "/v1/nodes/{node}/drain", "take a node out of its job now"),),
    "uncordon": (Route("POST", "/v1/nodes/{node}/uncordon", "let a node serve again"),),
    "health": (Route("GET", "/v1/jobs/{job}/nodes/{node}/health", "a node's GPU verdicts"),),
    "logs": (Route("GET", "/v1/jobs/{job}/logs/{rank}", "a rank's log (follow: streamed)"),),
    "stacks": (Route("GET", "/v1/jobs/{job}/stacks", "a live job's stacks, every rank's"),),
    # the pool's
    "submit": (Route("POST", "/v1/jobs", "submit a job"),),
    "alloc": (Route("POST", "/v1/allocations", "hold nodes for your own commands (salloc)"),),
    # A command's output streamed and its signals passed on both ways, straight between the
    # caller and each node's agent (telemetry/runwire.py): not through the API service.
    "run": (),
    "jobs": (Route("GET", "/v1/jobs", "the pool's jobs"),),
    "nodes": (Route("GET", "/v1/nodes", "the pool's nodes"),),
    "cancel": (Route("POST", "/v1/jobs/{job}/cancel", "end a job"),),
    "hold": (Route("POST", "/v1/jobs/{job}/hold", "keep a pending job from starting"),),
    "release": (Route("POST", "/v1/jobs/{job}/release", "let a held job start"),),
    "requeue": (Route("POST", "/v1/jobs/{job}/requeue", "put a running job back in its queue"),),
    "show": (Route("GET", "/v1/jobs/{job}", "a job in full, with its goodput"),),
    "history": (Route("GET", "/v1/history", "the ended jobs, with the accounting database's"),),
    "report": (Route("GET", "/v1/report", "usage by user, queue or day (sreport)"),),
    "share": (Route("GET", "/v1/share", "each user's fair share, usage and factor (sshare)"),),
    "queue": (
        Route("GET", "/v1/queues", "the pool's queues"),
        Route("POST", "/v1/queues", "create a queue"),
        Route("PATCH", "/v1/queues/{queue}", "change a queue"),
        Route("DELETE", "/v1/queues/{queue}", "delete a queue"),
    ),
    # API tokens: minted only by `nodeagentctl token`, with the caller's own MUNGE credential
    # (pool/tokens.py: a token never makes another); listed and revoked here too.
    "token": (
        Route("GET", "/v1/tokens", "your API tokens"),
        Route("DELETE", "/v1/tokens/{token}", "revoke a token (or all: every one of yours)"),
    ),
    # A browser's session (docs/ui.md): `nodeagentctl ui` mints a token and prints the link
    # whose sign-in page posts it here, once.
    "ui": (
        Route("POST", "/v1/session", "sign a browser in with a nodeagentctl ui link (once)"),
        Route("GET", "/v1/session", "who this session is"),
        Route("DELETE", "/v1/session", "sign out: the session's token revoked"),
    ),
}
