"""The pool leader's serving of requests alone: how long `Requests.serve` takes a submission.

    .venv/bin/python bench/pool_requests.py [--requests 2000] [--runs 3]

bench/api.py measures submissions through the API service, with the service, the load, the
agent and Redis on the same two cores. Here, in one process and nothing else running: a real
redis-server, this process made the pool's leader (its lease), a token of this process's user
registered, then --requests token-signed submissions appended to the requests stream at once
(each job asks for more nodes than any pool has: the queue only), and served batch by batch as
the leader serves them, with no round between. Prints, per run, the time per submission and the
Redis commands it cost (a Lua script's own commands counted). Writes
bench/results/pool-requests.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import pwd
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.config.hosts import Resolver  # noqa: E402
from nodeagent.config.settings import PoolConfig  # noqa: E402
from nodeagent.coord.client import connect  # noqa: E402
from nodeagent.coord.keys import PoolKeys  # noqa: E402
from nodeagent.coord.pool import PoolStore  # noqa: E402
from nodeagent.coord.tokens import TokenStore  # noqa: E402
from nodeagent.model.pool import PoolNode  # noqa: E402
from nodeagent.model.request import Request, Verb  # noqa: E402
from nodeagent.model.token import credential, new_claims, secret_of, token_text  # noqa: E402
from nodeagent.pool.authority import Authority  # noqa: E402
from nodeagent.pool.requests import Requests  # noqa: E402
from nodeagent.supervisor.munge import MungeProgram  # noqa: E402
from tests.helpers.cluster import RedisServer  # noqa: E402

NEVER = 100_000


def one_run(redis: RedisServer, pool: str, count: int) -> dict[str, Any]:
    store = PoolStore(connect(redis.url, 30.0), PoolKeys("nodeagent", pool))
    node = PoolNode(name="n0", address="127.0.0.1", lease_ttl_ms=3_600_000, labels={}, metrics="")
    leader = store.sync(node).leader
    assert leader is not None
    key = os.urandom(32)
    tokens = TokenStore(store.client, store.keys)
    unused = MungeProgram("/nonexistent")  # token credentials only: munged is never asked
    authority = replace(
        Authority(unused, PoolConfig(name=pool, auth="munge"), Resolver(), key),
        token_live=tokens.live,
    )
    me = pwd.getpwuid(os.getuid())
    now = int(time.time())
    claims = new_claims(pool, me.pw_name, me.pw_uid, me.pw_gid, now, 3600)
    tokens.add(claims, now)
    token = token_text(claims, secret_of(key, claims))
    pipe = store.client.pipeline(transaction=False)
    for i in range(count):
        doc = {"id": f"j{i:06d}", "entrypoint": ["true"], "min_nodes": NEVER, "max_nodes": NEVER}
        request = Request(pool, Verb.SUBMIT, {"spec": doc})
        request = replace(request, credential=credential(token, request.digest, now))
        pipe.xadd(store.keys.requests, {"request": request.to_json()})
    pipe.execute()
    leading = Requests(store, authority)
    commands_before = int(store.client.info("stats")["total_commands_processed"])
    served = accepted = 0
    began = time.perf_counter()
    while served < count:
        replies = leading.serve(leader)
        served += len(replies)
        accepted += sum(reply.ok for reply in replies)
    seconds = time.perf_counter() - began
    commands = int(store.client.info("stats")["total_commands_processed"]) - commands_before
    return {
        "submissions": count,
        "accepted": accepted,
        "seconds": round(seconds, 3),
        "ms_each": round(1000 * seconds / count, 3),
        "per_s": round(count / seconds, 1),
        "redis_commands_each": round(commands / count, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "pool-requests.json"))
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the leader logs each request; a node's journal takes it
    runs = []
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        redis = RedisServer(Path(tmp))
        redis.start()
        try:
            for run in range(args.runs):
                found = one_run(redis, f"bench{run}", args.requests)
                print(json.dumps(found), flush=True)
                runs.append(found)
        finally:
            redis.stop()
    result = {
        "what": "bench/pool_requests.py",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "runs": runs,
        "median_ms_each": statistics.median(r["ms_each"] for r in runs),
    }
    print(json.dumps({"median_ms_each": result["median_ms_each"]}))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
