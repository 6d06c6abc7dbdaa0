"""A request that arrives again is the request it repeats, and a "done" is confirmed first: the
pool leader's side of a batch of signed requests (pool/requests.py).

A change carries a request id (model/request.py `REQUEST_ID`): nodeagentctl makes one per
command and keeps it for its retries, the API takes the caller's Idempotency-Key. The same id
comes back when a caller tries again after no answer (a failover, a timeout), or when redis-py
sends the request twice (its retry of a command whose reply it lost): the first is answered,
the others are answered as it was, nothing done twice. What each id came to is kept beside the
answers (`RequestStore.answer`'s `done`, for the answers' time to live) and read for a whole
batch at once; within a batch the first of an id stands for the others. Only the same caller
gets it: another's request with that id is served as its own. A submission's spec also carries
the id, so a retry that finds no answer kept (a leader that died after storing the job and
before answering) still finds the job (coord/poolscripts.py).

Before the batch's answers are written, its changes are confirmed on the replicas
pool.durability asks for (coord/durable.py): each "done" of a batch not confirmed is answered
"not acknowledged" instead, with the id to try again with; what the id came to is kept as done,
so that try answers "done" once it is confirmed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from nodeagent.coord.durable import NONE, Durability, NotAcknowledged
from nodeagent.coord.requests import RequestStore
from nodeagent.model.request import Reply, Request


@dataclass
class Retries:
    """One batch's request ids: what each came to before, and in this batch."""

    store: RequestStore
    durability: Durability = NONE
    # where WAIT runs: a client whose socket timeout outlasts it (by default the store's)
    confirm_on: RequestStore | None = None
    _before: dict[str, Reply] = field(default_factory=dict)
    _now: dict[str, tuple[str, object]] = field(default_factory=dict)  # id -> (user, result)

    def read(self, requests: Iterable[Request]) -> None:
        """What the batch's request ids came to before (one round trip)."""
        self._now.clear()
        self._before = self.store.done(sorted({r.request_id for r in requests if r.request_id}))

    def again(self, request: Request, user: str) -> object | None:
        """What `user`'s request came to, if its id was served before: a Reply, or this batch's
        first of it (a Reply, or what pool/requests.py keeps for a submission not sent yet)."""
        rid = request.request_id
        if not rid:
            return None
        first = self._now.get(rid)
        if first is not None and first[0] == user:
            return first[1]
        before = self._before.get(rid)
        return before if before is not None and before.user == user else None

    def served(self, request: Request, user: str, result: object) -> None:
        """`user`'s request of this batch came to `result` (the first of its id stands)."""
        if request.request_id:
            self._now.setdefault(request.request_id, (user, result))

    def confirmed(self, replies: list[tuple[Reply, str]]) -> list[Reply]:
        """The batch's replies (each with its request id), each "done" confirmed on the
        replicas, or answered "not acknowledged".

        Raises:
            CoordinationError: Redis could not be reached to confirm them.
        """
        if not any(reply.ok for reply, _ in replies):
            return [reply for reply, _ in replies]
        client = (self.confirm_on or self.store).client
        try:
            self.durability.confirm(client, self.store.keys.acks, "the change")
        except NotAcknowledged as exc:
            return [r.as_unacknowledged(str(exc), rid) if r.ok else r for r, rid in replies]
        return [reply for reply, _ in replies]
