"""The pool leader takes the pool's signed requests (pool.auth: munge) and answers each.

For every request after the last one taken: decode its credential with this host's munged, check
that it binds this request and is fresh (model/credential.check), take it once for the whole
pool (RequestStore.claim: a credential seen before is a replay, whichever node leads), decide what
the caller may do, do it, and answer (the reply under the request's id, an event naming the
authenticated user). A request that is not one, unsigned, forged, expired, replayed or not
allowed changes nothing but the reply and the event that says why.

Who may do what (docs/pool.md, "Who is who"): anyone whose credential decodes submits jobs that
run as themselves, and cancels and scales their own; operators (pool.operators, and root) name
another user, act on every job, and alone change queues and cordons.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from nodeagent.coord import holds, poolqueues, runs
from nodeagent.coord.durable import NONE, Durability
from nodeagent.coord.lua import Call
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.poolscripts import submit_call, submitted
from nodeagent.coord.requests import RequestStore, Taking
from nodeagent.coord.store import JobStore
from nodeagent.coord.tokens import TokenStore
from nodeagent.errors import ConfigError, CorruptStateError
from nodeagent.model.credential import (
    Decoded,
    MungeUnavailable,
    check,
    credential_id,
)
from nodeagent.model.job import Command, CommandType, Cordon, Event
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.model.queues import DEFAULT, MAX_NODES, QueueView
from nodeagent.model.request import Caller, Reply, Request, Verb
from nodeagent.model.spec import JobSpec, load_spec
from nodeagent.model.token import is_token_credential
from nodeagent.pool import cordoning, holders, jobverbs
from nodeagent.pool.authority import Authority
from nodeagent.pool.refusals import (
    Forbidden,
    Invalid,
    Missing,
    Replayed,
    refused,
    replayed,
    submitted_message,
)
from nodeagent.pool.retries import Retries
from nodeagent.pool.submission import (
    Known,
    Refused,
    checked,
    in_use,
    store_array,
)
from nodeagent.pool.tokens import Minted, TokenRefused, Tokens, who_is

log = logging.getLogger(__name__)
BATCH = 64  # requests taken at once (their answers written in one round trip)


@dataclass(frozen=True)
class Pending:
    """A submission whose script (POOL_TAKE_SUBMIT) waits to be sent with the batch's others:
    who sent it and what it stores, to say what came of it."""

    request_id: str
    taking: Taking
    submission: Call
    user: str  # the caller's name
    spec: JobSpec

    def reply(self, found: tuple[bool, PoolJob | None] | None, pool: str) -> Reply:
        """What the script's answer means for the caller."""
        if found is None:
            return replayed(self.user)
        created, status = found
        if not created:
            return refused(Refused(in_use(self.spec.id, pool, status)), self.user)
        return Reply(True, submitted_message(self.spec.id, self.spec.user), self.user)


class Requests:
    """The pool leader's side of the requests stream, one batch per round. Each request is
    taken (POOL_CLAIM: the cursor past it, its credential remembered) before anything it asks
    is done; a submission is taken in the script that stores its job (POOL_TAKE_SUBMIT), one
    round trip less, and if it is refused, taken then.

    The scripts of a batch's submissions go to Redis together, in the batch's order, in one
    round trip (`Pending`, `_flush`), not one round trip each: anything else that writes or
    reads what they write (any other verb, a refusal's take, an array, a dependency) first
    sends those before it. Redis runs them in order, so a leader that dies leaves a prefix of
    its batch taken, as when it sent them one by one."""

    def __init__(
        self,
        store: PoolStore,
        authority: Authority,
        now: Callable[[], float] = time.time,
        waiting: RequestStore | None = None,
        stored: Callable[[JobSpec, str], None] | None = None,
        durability: Durability = NONE,
    ) -> None:
        """`waiting`: the requests' store `more` blocks on, on a client whose socket timeout
        outlasts the wait (by default one on the store's client). `stored`: told of each spec
        stored, as it was written (by default the leader's store, `store`: PoolStore.made;
        served in a process of its own, runtime/servechild.py, that process's parent)."""
        # A store of its own: its reads must not reset what the leader's store keeps between
        # rounds (its view of the nodes, the specs decoded, PoolStore.read and specs).
        self._store = PoolStore(store.client, store.keys)
        self._stored = stored or store.made
        self._requests = RequestStore(store.client, store.keys)
        self._waiting = waiting or self._requests
        # what a request id came to (a retry's answer), and each "done" confirmed (retries.py)
        self._retries = Retries(self._requests, durability, self._waiting)
        self._authority = authority
        self._token_store = TokenStore(store.client, store.keys)
        self._tokens = Tokens(self._token_store, authority)
        self._now = now
        # Whether each token seen in this batch is registered and not revoked: read once a
        # batch (100 clients with one token cost one read, not 100), forgotten at a TOKEN
        # request, so a revocation holds for every request after it.
        self._live: dict[str, bool] = {}
        self._known = Known()  # the arrays and queues the batch's submissions name
        self._taking: Taking | None = None  # the request being served, until it is taken
        self._pending: list[Pending] = []  # submissions not sent yet, in the batch's order
        self._sent: dict[str, Reply] = {}  # what came of those sent, by request id
        self.last_taken: str | None = None  # the id of the last request the last serve took

    def more(self, seconds: float) -> bool:
        """A request after those the last serve took (or, none taken, after the cursor it
        read) is waiting, or comes within `seconds`."""
        after = self.last_taken or self._requests.cursor or "0-0"
        return self._waiting.more_after(after, max(1, round(seconds * 1000)))

    def serve(self, leader: str) -> list[Reply]:
        """Take and answer every request waiting (at most one batch).

        Raises:
            CoordinationError, FencedError: as the store's calls.
            MungeUnavailable: munged cannot be reached (nothing was taken).
        """
        self._live.clear()
        self._pending.clear()
        self._sent.clear()
        self.last_taken = None
        batch = [(request_id, _parsed(raw)) for request_id, raw in self._requests.requests(BATCH)]
        requests = [r for _, r in batch if isinstance(r, Request)]
        self._known.read(self._store, *_named(requests))
        self._retries.read(requests)
        taken = []
        for request_id, request in batch:
            taken.append((request_id, *self._take(leader, request_id, request)))
            self.last_taken = request_id
        self._flush()
        done: dict[str, Reply] = {}  # what each request id came to, for its retries
        replies = []
        for _, judged, data in taken:
            reply = judged if isinstance(judged, Reply) else self._sent[judged.request_id]
            rid = data.get("request_id", "")
            if rid and not data.get("again") and reply.kind != "unauthenticated":
                done.setdefault(rid, reply)
            replies.append((reply, rid))
        confirmed = self._retries.confirmed(replies)
        answers: list[tuple[str, Reply, Event | None]] = []
        for (request_id, _, data), reply in zip(taken, confirmed, strict=True):
            kind = "request_done" if reply.ok else "request_refused"
            # An allocation's renewal, every few seconds while its shell runs: no event, no
            # log line (its holder polls the reply: pool/holders.py).
            quiet = reply.ok and data.get("verb") == Verb.KEEP.value
            level = logging.DEBUG if quiet else logging.INFO if reply.ok else logging.WARNING
            log.log(level, "pool request %s %s: %s", request_id, kind, reply.message)
            event = Event(kind, message=f"{reply.user or 'nobody'}: {reply.message}", data=data)
            answers.append((request_id, reply, None if quiet else event))
        self._requests.answer(answers, done)  # the batch's answers in one round trip
        return [reply for _, reply, _ in answers]

    def _flush(self) -> None:
        """Send the submissions waiting, in order; what came of each is kept for its answer."""
        pending, self._pending = self._pending, []
        found = self._requests.take_submits([(p.taking, p.submission) for p in pending])
        pool = self._store.keys.pool
        for each, result in zip(pending, found, strict=True):
            self._sent[each.request_id] = each.reply(result, pool)
            if result is not None and result[0]:
                self._stored(each.spec, each.submission.args["spec"])

    def _claim(self, taking: Taking) -> bool:
        """Take a request now, after the submissions before it."""
        self._flush()
        return self._requests.claim(taking)

    def _take(
        self, leader: str, request_id: str, request: Request | CorruptStateError
    ) -> tuple[Reply | Pending, dict[str, Any]]:
        data: dict[str, Any] = {"request": request_id}
        if isinstance(request, CorruptStateError):
            self._claim(Taking(leader, request_id))
            return Reply(False, f"refused: {request}"), data
        data["verb"] = request.verb.value
        decoded, found = self._decode(request)
        if decoded is not None:  # signed: who tried is said even when refused
            data["user"] = self._authority.caller(decoded).name
        if isinstance(found, str):
            self._claim(Taking(leader, request_id))
            why = f"refused: {found}"
            return Reply(False, why, data.get("user", ""), kind="unauthenticated"), data
        caller = self._authority.caller(found)
        expires_ms = (found.encoded_s + found.ttl_s) * 1000
        taking = Taking(leader, request_id, credential_id(request.credential), expires_ms)
        if request.request_id:
            data["request_id"] = request.request_id
        again = self._retries.again(request, caller.name)
        if isinstance(again, Reply | Pending):  # its id was served: answered as it was
            self._claim(taking)  # (the cursor past it, replayed or not)
            data["again"] = True
            return again, data
        self._taking = taking
        try:
            if request.verb is not Verb.SUBMIT:  # taken before anything is done
                self._take_now()
            judged = self._judge(caller, request, data)
            self._take_now()  # a submission refused (one stored took its request with it)
            self._retries.served(request, caller.name, judged[0])
            return judged
        except Replayed:
            return replayed(caller.name), data
        finally:
            self._taking = None  # not taken if it raised: served again, never done twice

    def _take_now(self) -> None:
        """Take the request being served, unless it was. Raises: Replayed."""
        taking, self._taking = self._taking, None
        if taking is not None and not self._claim(taking):
            raise Replayed

    def _judge(
        self, caller: Caller, request: Request, data: dict[str, Any]
    ) -> tuple[Reply | Pending, dict[str, Any]]:
        if request.pool != self._store.keys.pool:
            return Reply(False, f"refused: signed for pool {request.pool}", caller.name), data
        munge_signed = not is_token_credential(request.credential)
        if request.as_uid is not None:
            behalf = self._authority.on_behalf(caller, request.as_uid) if munge_signed else None
            if not isinstance(behalf, Caller):
                why = behalf or "a token holder may not act for others"
                return Reply(False, f"refused: {why}", caller.name, kind="forbidden"), data
            data["user"], caller, munge_signed = behalf.name, behalf, False
        try:
            done = self._apply(caller, request, munge_signed)
        except (Refused, TokenRefused) as exc:
            return refused(exc, caller.name), data
        if isinstance(done, Pending):
            return done, data
        if isinstance(done, Minted):
            return Reply(True, done.message, caller.name, sealed=done.sealed), data
        return Reply(True, done, caller.name), data

    def _decode(self, request: Request) -> tuple[Decoded | None, Decoded | str]:
        """What the credential says if munged (or the token key) verified it, and the verdict
        on it."""
        if not request.credential:
            return None, "not signed: pool.auth is munge, every request needs a MUNGE credential"
        if is_token_credential(request.credential):
            proven = self._tokens.identify(request, int(self._now()), self._token_live)
            return (proven if isinstance(proven, Decoded) else None), proven
        found = self._authority.munge.decode(request.credential)
        signed = found if isinstance(found, Decoded) and found.status.signed else None
        return signed, check(found, request.digest)

    def _token_live(self, token_id: str) -> bool:
        if token_id not in self._live:
            self._live[token_id] = self._token_store.live(token_id)
        return self._live[token_id]

    def _apply(
        self, caller: Caller, request: Request, munge_signed: bool
    ) -> str | Minted | Pending:
        args = request.args
        if request.verb is Verb.WHOAMI:
            return who_is(caller)
        if request.verb is Verb.TOKEN:
            self._live.clear()
            return self._tokens.apply(caller, request, munge_signed, int(self._now()))
        if request.verb is Verb.SUBMIT:
            hold = args.get("hold") is True
            return self._submit(caller, args.get("spec"), hold, request.request_id)
        if request.verb in (Verb.HOLD, Verb.RELEASE, Verb.REQUEUE):
            verb = request.verb.value
            return self._each(
                caller, verb, _name(args, "job"), lambda j: self._job_verb(caller, verb, j)
            )
        if request.verb is Verb.CANCEL:
            return self._each(
                caller, "cancel", _name(args, "job"), lambda j: self._cancel(caller, j)
            )
        if request.verb is Verb.SCALE:
            return self._scale(caller, _name(args, "job"), str(args.get("target", "")))
        if request.verb is Verb.KEEP:
            return self._keep(caller, _name(args, "job"))
        if request.verb is Verb.COMMAND:
            return self._command(caller, _name(args, "job"), str(args.get("kind", "")))
        if not caller.operator:
            what = "queues" if request.verb is Verb.QUEUE else "cordons and drains"
            raise Forbidden(
                f"{caller.name} is not an operator of the pool: only operators manage {what}"
            )
        if request.verb is Verb.QUEUE:
            self._known.forget()  # what the batch's later submissions read changes
            return self._queue(caller, args)
        return self._cordon(caller, args)

    def _submit(self, caller: Caller, doc: object, hold: bool, request_id: str) -> str | Pending:
        try:
            spec = replace(load_spec(doc, default_user=caller.name), request=request_id)
        except ConfigError as exc:
            raise Invalid(f"invalid job spec: {exc}") from None
        if spec.user != caller.name and not caller.operator:
            raise Forbidden(
                f"{caller.name} may not submit as {spec.user}: only operators (pool.operators) "
                "name another user"
            )
        if spec.dependency:  # what it names may be among the submissions not sent yet
            self._flush()
        spec = checked(self._store, spec, self._known)
        held_by = caller.name if hold else ""
        if spec.array is not None:
            self._known.forget()  # the arrays it registers
            self._take_now()  # before its tasks are stored
            by = replace(spec, submitted_by=caller.name)
            return store_array(self._store, by, held_by, self._sign)
        signed = self._sign(replace(spec, submitted_by=caller.name))
        taking, self._taking = self._taking, None
        if taking is None:  # (taken already: stored on its own, after those before it)
            self._flush()
            created, status = self._store.submit(signed, held_by=held_by)
            if not created:
                raise Refused(in_use(spec.id, self._store.keys.pool, status))
            return submitted_message(spec.id, spec.user)
        submission = submit_call(self._store.keys, signed, False, held_by, submitted(signed))
        pending = Pending(taking.request_id, taking, submission, caller.name, signed)
        self._pending.append(pending)  # sent with the batch's others (_flush)
        return pending

    def _owned(
        self, caller: Caller, job_id: str, verb: str, pinned_ok: bool = False
    ) -> tuple[PoolJobState, JobSpec | None]:
        """The job's state and spec (None: pinned, operators only) when `caller` may `verb`
        it."""
        status = self._store.status(job_id)
        if status is None:
            raise Missing(f"no job {job_id!r} in pool {self._store.keys.pool}")
        if status.state.ended:
            raise Refused(f"job {job_id} has ended already ({status.state.value})")
        if status.pinned:
            if not pinned_ok:
                raise Refused(f"job {job_id} comes from its nodes' job: sections")
            if not caller.operator:
                raise Forbidden(
                    f"{caller.name} may not {verb} job {job_id}: it is pinned by its nodes' "
                    "job: sections, only operators act on it"
                )
            return status.state, None
        spec = self._store.spec(job_id)
        if not isinstance(spec, JobSpec):
            raise Refused(f"job {job_id}: its spec cannot be read ({spec})")
        if not caller.may_act_on(spec.user):
            raise Forbidden(f"{caller.name} may not {verb} job {job_id} of {spec.user}")
        return status.state, spec

    def _each(self, caller: Caller, verb: str, job_id: str, act: Callable[[str], str]) -> str:
        """`verb` on the job, or, when no job has that id, on each task of the array of that
        id it can be done to now (model/array.py): those that have ended, say, are left."""
        if self._store.status(job_id) is not None:
            return act(job_id)
        tasks = list(runs.tasks_of(self._store, job_id))
        if not tasks:
            raise Missing(
                f"no job {job_id!r} in pool {self._store.keys.pool}, nor an array of that id"
            )
        doable = []  # each task checked before any is acted on: all of them, or none
        for task in tasks:
            try:
                self._owned(caller, task, verb)
            except Forbidden:
                raise  # before anything is done
            except Refused:  # ended, say: left alone
                continue
            doable.append(task)
        done, left = 0, []
        for task in doable:
            try:
                act(task)
                done += 1
            except Refused as exc:
                left.append(str(exc))
        if not done:
            why = left[0] if left else "every task has ended"
            raise Refused(f"array {job_id}: {verb} done to none of its tasks: {why}")
        return f"array {job_id}: {verb} done to {done} of its {len(tasks)} tasks by {caller.name}"

    def _cancel(self, caller: Caller, job_id: str) -> str:
        self._owned(caller, job_id, "cancel")
        self._store.cancel(job_id, caller.name)
        return f"job {job_id}: cancel requested by {caller.name}"

    def _keep(self, caller: Caller, job_id: str) -> str:
        """An attended allocation's holder renews its lease (pool/holders.py)."""
        _, spec = self._owned(caller, job_id, "keep")
        if spec is None or not spec.attended:
            raise Refused(f"job {job_id} is not an allocation held from a terminal")
        self._store.keep_holder(job_id, holders.TTL_MS)
        return f"allocation {job_id}: kept"

    def _job_verb(self, caller: Caller, verb: str, job_id: str) -> str:
        """hold, release or requeue (pool/jobverbs.py), by the job's owner or an operator."""
        self._owned(caller, job_id, verb)
        status = self._store.status(job_id)
        held = holds.held_by(self._store, job_id)
        if status is None:
            raise Missing(f"no job {job_id!r} in pool {self._store.keys.pool}")
        why = jobverbs.refusal(verb, job_id, status, held)
        if why is not None:
            raise Refused(why)
        if verb == "hold":
            holds.hold(self._store, job_id, caller.name)
        elif verb == "release":
            holds.release(self._store, job_id, caller.name)
        else:
            holds.requeue(self._store, job_id, caller.name, status.admitted_ms or 0)
        return jobverbs.done(verb, job_id, caller.name)

    def _scale(self, caller: Caller, job_id: str, value: str) -> str:
        state, spec = self._owned(caller, job_id, "scale", pinned_ok=True)
        record = self._store.records([job_id]).get(job_id)
        pending = state is PoolJobState.PENDING
        plan = jobverbs.scale_plan(
            job_id, value, pending, record, spec.job if spec is not None else None
        )
        if isinstance(plan, str):
            raise Refused(plan)
        current, target = plan
        if pending and spec is not None:
            job = spec.job
            self._store.replace_spec(
                self._sign(replace(spec, job=replace(job, target_nodes=target)))
            )
        else:
            jobs = JobStore(self._store.client, self._store.keys.job(job_id))
            jobs.send_command(Command(CommandType.SCALE, target=target, by=caller.name))
        return f"job {job_id}: target {current} -> {target} requested by {caller.name}"

    def _command(self, caller: Caller, job_id: str, kind: str) -> str:
        if kind not in (CommandType.STOP.value, CommandType.RESTART.value):
            raise Refused(f"command: expected stop or restart, got {kind[:32]!r}")
        state, spec = self._owned(caller, job_id, kind, pinned_ok=True)
        if kind == CommandType.STOP.value and spec is not None:  # submitted, not pinned
            raise Refused(jobverbs.stop_refusal(job_id))
        if state is PoolJobState.PENDING:
            raise Refused(f"job {job_id} is pending: `cancel` ends it, nothing runs to {kind}")
        jobs = JobStore(self._store.client, self._store.keys.job(job_id))
        jobs.send_command(Command(CommandType(kind), by=caller.name))
        return f"job {job_id}: {kind} requested by {caller.name}"

    def _queue(self, caller: Caller, args: Mapping[str, Any]) -> str:
        action, name = str(args.get("action", "")), _name(args, "name")
        existing = poolqueues.queue(self._store.client, self._store.keys, name)
        if action == "delete":
            if existing is None:
                raise Refused(f"no queue {name}")
            inside = self._jobs_in(name)
            if inside:
                raise Refused(
                    f"queue {name} has {len(inside)} jobs that have not ended "
                    f"({', '.join(inside[:5])}): cancel them or wait for them first"
                )
            poolqueues.delete_queue(self._store.client, self._store.keys, name, caller.name)
            return f"queue {name}: deleted by {caller.name}"
        if action == "create" and (existing is not None or name == DEFAULT):
            raise Refused(f"queue {name} exists already: `queue set {name}` changes it")
        if action == "set" and existing is None and name != DEFAULT:
            raise Refused(f"no queue {name}: `queue create {name}` makes it")
        if action not in ("create", "set"):
            raise Refused(f"queue: expected create, set or delete, got {action!r}")
        base = existing or QueueView(name)
        queue = QueueView(
            name,
            quota=_number(args, "quota", base.quota),
            guaranteed=_number(args, "guaranteed", base.guaranteed) or 0,
            max_priority=_number(args, "max_priority", base.max_priority),
            gpu_quota=_number(args, "gpu_quota", base.gpu_quota),
            gpu_guaranteed=_number(args, "gpu_guaranteed", base.gpu_guaranteed) or 0,
        )
        if queue.problems():
            raise Refused(f"queue {name}: {'; '.join(queue.problems())}")
        poolqueues.set_queue(
            self._store.client, self._store.keys, queue, caller.name, created=existing is None
        )
        return f"queue {name}: {queue.describe()} (by {caller.name})"

    def _jobs_in(self, queue: str) -> list[str]:
        live = [j for j, s in self._store.read().jobs.items() if not s.state.ended]
        specs = self._store.specs(live)
        return sorted(j for j, s in specs.items() if isinstance(s, JobSpec) and s.queue == queue)

    def _cordon(self, caller: Caller, args: Mapping[str, Any]) -> str:
        action, node = str(args.get("action", "")), _name(args, "node")
        if args.get("job") is not None:
            return self._job_cordon(caller, _name(args, "job"), action, node, args)
        if not self._store.knows_node(node):
            raise Missing(f"node {node!r} is not in pool {self._store.keys.pool}")
        if action not in cordoning.ACTIONS:
            raise Refused(f"cordon: expected cordon, drain or uncordon, got {action!r}")
        reason = str(args.get("reason", ""))[:256] or f"{action}ed by an operator"
        done = cordoning.apply(self._store, node, action, reason, caller.name)
        return done.said(node, action, f" by {caller.name}")

    def _job_cordon(
        self, caller: Caller, job_id: str, action: str, node: str, args: Mapping[str, Any]
    ) -> str:
        """cordon, drain, uncordon of a node inside one job (`nodeagentctl --job JOB ...`)."""
        jobs = JobStore(self._store.client, self._store.keys.job(job_id))
        snapshot = jobs.snapshot()
        cordoned = set(jobs.cordons())
        known = {lease.name for lease in snapshot.leases} | cordoned
        if snapshot.record is not None:
            known |= set(snapshot.record.members)
        if node not in known:
            raise Missing(f"node {node!r} is not in job {job_id}")
        if action == "uncordon":
            lifted = node in cordoned and jobs.uncordon(node, caller.name)
            return f"node {node}: " + ("uncordoned" if lifted else "was not cordoned")
        if action not in ("cordon", "drain"):
            raise Refused(f"cordon: expected cordon, drain or uncordon, got {action!r}")
        reason = str(args.get("reason", ""))[:256] or f"{action}ed by an operator"
        jobs.cordon(node, Cordon(reason=reason, by=caller.name, drain=action == "drain"))
        done = "drained" if action == "drain" else "cordoned"
        return f"node {node}: {done} in job {job_id} by {caller.name}"

    def _sign(self, spec: JobSpec) -> JobSpec:
        try:
            return self._authority.sign(spec)
        except MungeUnavailable as exc:
            raise Refused(f"the pool leader cannot sign the spec: {exc}") from None


def _parsed(raw: str) -> Request | CorruptStateError:
    try:
        return Request.from_json(raw)
    except CorruptStateError as exc:
        return exc


def _named(requests: list[Request]) -> tuple[list[str], list[str]]:
    """The job ids and queues the submissions among `requests` name, as their documents say
    (Known: read for them at once; a spec whose id or queue loads otherwise is read alone)."""
    ids, queues = [], []
    for request in requests:
        doc = request.args.get("spec") if request.verb is Verb.SUBMIT else None
        if isinstance(doc, dict) and isinstance(doc.get("id"), str):
            ids.append(doc["id"])
            queue = doc.get("queue", DEFAULT)
            queues.append(queue if isinstance(queue, str) else DEFAULT)
    return ids, queues


def _name(args: Mapping[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value or len(value) > 64:
        raise Refused(f"{key}: expected a name, got {str(value)[:64]!r}")
    return value


def _number(args: Mapping[str, Any], key: str, default: int | None) -> int | None:
    if key not in args:
        return default
    value = args[key]
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or abs(value) > MAX_NODES:
        raise Refused(f"{key}: expected a whole number or none, got {str(value)[:32]!r}")
    return value
