"""The job's copies hash (keys.COPIES_KEY): the leader writes each node its share of the copies
of the job's saves (model/handout.py), fenced by its lease; each node reads its own field.

The leader writes only the fields that changed since it last wrote, in pages (a 10,000-field
write in one call would hold Redis for tens of ms); the first page of a new term first empties
the hash, so no share another leader wrote outlives it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import redis

from nodeagent.coord.errors import redis_errors
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.lua import Call, Script
from nodeagent.errors import CorruptStateError
from nodeagent.model.handout import Handout

log = logging.getLogger(__name__)
PAGE = 1000  # fields a HAND_OUT call writes

# `rest`: n, then n (node, JSON Handout) pairs to write, then the nodes whose share goes.
# `reset` '1': empty the hash first (a new term; garbage of the wrong type goes too).
HAND_OUT = Script(
    "HAND_OUT",
    keys=("leader", "copies"),
    args=("leader_value", "reset"),
    returns="1, or an error starting with FENCED",
    body="""
if redis.pcall('GET', K.leader) ~= A.leader_value then
  return redis.error_reply('FENCED leader lease is not ' .. A.leader_value)
end
if A.reset == '1' or redis.call('TYPE', K.copies).ok ~= 'hash' then
  redis.call('UNLINK', K.copies)
end
local n = tonumber(ARGV[REST])
if n > 0 then
  local hset = {'HSET', K.copies}
  for i = REST + 1, REST + 2 * n do hset[#hset + 1] = ARGV[i] end
  redis.call(unpack(hset))
end
if #ARGV > REST + 2 * n then
  redis.call('HDEL', K.copies, unpack(ARGV, REST + 2 * n + 1))
end
return 1
""",
)


class CopiesHash:
    """One job's copies hash in one Redis."""

    def __init__(self, client: redis.Redis, keys: JobKeys) -> None:
        self.client = client
        self.keys = keys
        self._hand_out = HAND_OUT.bind(client)
        self._bad: str | None = None  # the garbage last said of this node's field

    def write(
        self, leader: str, shares: Mapping[str, str], drop: Sequence[str], reset: bool
    ) -> None:
        """Write `shares` (node -> JSON Handout) and remove the shares of `drop`, fenced by the
        leader lease `leader`; `reset`: empty the hash first.

        Raises: FencedError (another agent leads), CoordinationError."""
        items = list(shares.items())
        for first in range(0, max(len(items), len(drop), 1), PAGE):
            page, gone = items[first : first + PAGE], drop[first : first + PAGE]
            call = Call(
                {"leader": self.keys.leader, "copies": self.keys.copies},
                {"leader_value": leader, "reset": "1" if reset and first == 0 else "0"},
                [len(page), *(part for pair in page for part in pair), *gone],
            )
            with redis_errors("hand out the copies"):
                self._hand_out(call)

    def read(self, name: str) -> Handout | None:
        """Node `name`'s share (None: none written). What nodeagent did not write is logged
        once and read as none: the leader writes every share again within a minute
        (job/checkpoints/handouts.py).

        Raises: CoordinationError."""
        try:
            with redis_errors("read this node's copies"):
                raw = self.client.hget(self.keys.copies, name)
        except CorruptStateError as exc:  # the hash is not a hash: the leader replaces it
            raw, problem = None, str(exc)
        else:
            if raw is None:
                return None
            try:
                return Handout.from_json(raw, f"{self.keys.copies} field {name}")
            except CorruptStateError as exc:
                problem = str(exc)
        if problem != self._bad:
            log.warning("garbage in Redis: %s (read as no copies to make)", problem)
        self._bad = problem
        return None
