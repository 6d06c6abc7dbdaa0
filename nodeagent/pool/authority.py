"""Who is who for a pool agent (pool.auth: munge): its munged, this host's users, the pool's
operators. The pool leader asks it who made a request (`caller`), signs the specs it accepts
(`sign`); the leader and every placed node check a spec's signature (`vouch`); the HTTP server
asks who may read a log (`may_read`, telemetry/logserve.LogAccess).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nodeagent.config.hosts import Resolver
from nodeagent.config.keyfile import read_token_key
from nodeagent.config.settings import PoolConfig
from nodeagent.errors import ConfigError
from nodeagent.model.credential import (
    Decoded,
    Munge,
    MungeStatus,
    MungeUnavailable,
    bound,
    check,
)
from nodeagent.model.request import Caller
from nodeagent.model.spec import JobSpec
from nodeagent.model.token import check_credential, is_token_credential
from nodeagent.supervisor.libmunge import munge_at


def not_taken(pool: str) -> str:
    return (
        f"pool {pool} takes no API tokens: its agents have no token key (pool.tokens.key_file, "
        "docs/api.md)"
    )


SPEC_HMAC = "hmac1:"  # a spec signed with the pool's key, not a MUNGE credential


def _spec_mac(key: bytes, digest: str) -> str:
    return hmac.new(key, b"nodeagent-spec-v1 " + digest.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Authority:
    """Who is who for this agent: its munged, this host's users, the pool's operators."""

    munge: Munge
    pool: PoolConfig
    resolve: Resolver
    token_key: bytes | None = None  # pool.tokens.key_file's (model/token.py); None: no tokens
    # whether a token's id is registered, not revoked (coord/tokens.TokenStore.live; the
    # wiring sets it once Redis is connected: until then a log is read with MUNGE only)
    token_live: Callable[[str], bool] | None = None
    _vouched: dict[tuple[str, str], str | None] = field(default_factory=dict, compare=False)

    def caller(self, found: Decoded) -> Caller:
        name = self.resolve.name_of(found.uid) or f"uid {found.uid}"
        operators = self.pool.operators
        operator = found.uid == 0 or name in operators.users
        if not operator and operators.groups:
            member_of = set(self.resolve.groups_of(name, found.gid)) | {found.gid}
            gids = {self.resolve.group(g) for g in operators.groups}
            operator = bool(member_of & gids)
        return Caller(found.uid, found.gid, name, operator)

    def on_behalf(self, api: Caller, uid: int) -> Caller | str:
        """The caller on the API service's Unix socket, uid `uid` by the kernel, for whom the
        service's account `api` vouches; or why not: only accounts of pool.api_users vouch,
        and never for root or an operator (they sign their own requests, or use a token)."""
        if api.name not in self.pool.api_users:
            return f"{api.name} may not act for others: not in pool.api_users"
        name = self.resolve.name_of(uid)
        account = self.resolve.user(name) if name is not None else None
        if account is None:
            return f"uid {uid} has no user on the pool leader's host"
        caller = self.caller(Decoded(MungeStatus.SUCCESS, uid, account.gid, "", 0, 0))
        if caller.operator:
            return (
                f"{caller.name} is an operator: the API service does not act for operators "
                "(sign with nodeagentctl, or use a token)"
            )
        return caller

    def sign(self, spec: JobSpec) -> JobSpec:
        """The spec with this agent's signature over it: what nodes accept (vouch). With the
        pool's key (pool.tokens.key_file) an HMAC of it, which only the pool's agents can make
        (a uid-0 MUNGE credential can be made by root on any host of the MUNGE realm, a login
        host included); else a MUNGE credential of this agent's.

        Raises:
            MungeUnavailable: munged cannot be reached.
        """
        digest = spec.signed_digest
        if self.token_key is not None:  # the pool's key: no munge process per submission
            signature = SPEC_HMAC + _spec_mac(self.token_key, digest)
        else:
            signature = self.munge.encode(bound(digest))
        signed = spec.signed_with(signature)
        self._remember((signed.signature, signed.signed_digest), None)  # made here: sound
        return signed

    def vouch(self, spec: JobSpec) -> str | None:
        """Why a stored spec must not run (None: an agent of this pool signed it as it is).

        Raises:
            MungeUnavailable: munged cannot be reached.
        """
        if not spec.signature:
            return "not signed (pool.auth: munge): written to Redis by hand, not by the pool leader"
        held = (spec.signature, spec.signed_digest)
        try:
            return self._vouched[held]
        except KeyError:  # not known (or just forgotten by the requests' thread: serving.py)
            verdict = self._vouch(spec)
        self._remember(held, verdict)
        return verdict

    def signed(self, spec: JobSpec) -> None:
        """`spec` as this pool's serving signed it in another process of this agent
        (runtime/servechild.py): vouched for without checking its signature again."""
        self._remember((spec.signature, spec.signed_digest), None)

    def _remember(self, held: tuple[str, str], verdict: str | None) -> None:
        if len(self._vouched) > 4096:
            self._vouched.clear()
        self._vouched[held] = verdict

    def _vouch(self, spec: JobSpec) -> str | None:
        if spec.signature.startswith(SPEC_HMAC):
            if self.token_key is None:
                return (
                    "signed with the pool's key (pool.tokens.key_file), which this node lacks: "
                    "give every node of the pool the same key"
                )
            mac = _spec_mac(self.token_key, spec.signed_digest)
            if not hmac.compare_digest(SPEC_HMAC + mac, spec.signature):
                return "its signature: not made with this pool's key, or the spec altered"
            return None
        found = check(self.munge.decode(spec.signature), spec.signed_digest, stored=True)
        if isinstance(found, str):
            return f"its signature: {found}"
        agent = self.resolve.agent()
        if found.uid not in (0, agent.uid):
            return f"signed by uid {found.uid}, not by an agent of the pool"
        return None

    def may_read(
        self, digest: str, credential: str, gid: int, as_uid: int | None = None
    ) -> str | None:
        """telemetry/logserve.LogAccess: a fresh credential (MUNGE, or an API token's) bound to
        the log request of `digest`, of an operator or of a member of the log's group `gid`
        (the job's); `as_uid`: the API service's socket caller, whom its account vouches for."""
        caller = self._requester(digest, credential, as_uid)
        if isinstance(caller, str):
            return caller
        if caller.operator or gid == caller.gid:
            return None
        if gid in self.resolve.groups_of(caller.name, caller.gid):
            return None
        return f"{caller.name} may not read this log: it is another user's job's"

    def may_act(
        self, digest: str, credential: str, uid: int, operators: bool, as_uid: int | None = None
    ) -> str | None:
        """telemetry/jobaccess.JobAccess: a fresh credential bound to the request of `digest`,
        of the job's user `uid` or, where `operators`, of an operator; else why not. Stricter
        than a log's reader: the job's group is not its user (a shared group would let every
        member act as each other)."""
        caller = self._requester(digest, credential, as_uid)
        if isinstance(caller, str):
            return caller
        if caller.uid == uid or (operators and caller.operator):
            return None
        whose = "its user or an operator" if operators else "its user alone"
        return f"{caller.name} may not: the job is another user's ({whose} may)"

    def token_holder(
        self, credential: str, digest: str, live: Callable[[str], bool] | None, now_s: int
    ) -> Decoded | str:
        """Who a token credential proving the request of `digest` comes from (model/token.py),
        as a decoded credential good while its proof is (the replay memory keeps it that
        long), or why it is refused; `live`: whether a token's id is registered, not revoked
        (None: this node cannot tell, and takes no token)."""
        if self.token_key is None or live is None:
            return not_taken(self.pool.name)
        proven = check_credential(self.token_key, credential, digest, self.pool.name, now_s)
        if isinstance(proven, str):
            return proven
        claims = proven.claims
        if not live(claims.id):
            return f"token {claims.id} revoked (or never minted by this pool)"
        ttl_s = proven.fresh_until_s - claims.issued_s
        return Decoded(
            MungeStatus.SUCCESS, claims.uid, claims.gid, bound(digest), claims.issued_s, ttl_s
        )

    def _requester(self, digest: str, credential: str, as_uid: int | None) -> Caller | str:
        """Who sent an agent's request of `digest` (`as_uid`: whom the API service's
        credential vouches for), or why it is refused."""
        found = self._log_reader(digest, credential)
        if isinstance(found, str):
            return found
        caller = self.caller(found)
        if as_uid is None:
            return caller
        behalf = self.on_behalf(caller, as_uid) if not is_token_credential(credential) else None
        if not isinstance(behalf, Caller):
            return behalf or "a token holder may not act for others"
        return behalf

    def _log_reader(self, digest: str, credential: str) -> Decoded | str:
        if is_token_credential(credential):
            return self.token_holder(credential, digest, self.token_live, int(time.time()))
        try:
            return check(self.munge.decode(credential), digest)
        except MungeUnavailable as exc:
            return f"this node cannot check credentials: {exc}"


def pool_authority(pool: PoolConfig, resolve: Resolver | None = None) -> Authority | None:
    """Who is who in the pool (pool.auth: munge), once this host's munged answers; None for
    pool.auth: none.

    Raises:
        ConfigError: naming pool.auth, when munged cannot be reached (exit 78).
    """
    if pool.auth != "munge":
        return None
    munge = munge_at(pool.munge_socket)
    try:
        munge.encode("nodeagent: is munged there")
    except MungeUnavailable as exc:
        raise ConfigError(
            "pool.auth",
            f"munge, but {exc}: start munged on this node (Debian: apt-get install munge; the "
            "pool's nodes share /etc/munge/munge.key), point pool.munge_socket at its socket, "
            "or set pool.auth: none (whoever can write the pool's Redis keys then acts as anyone)",
        ) from None
    key = read_token_key(pool.tokens.key_file) if pool.tokens.key_file else None
    return Authority(munge, pool, resolve or Resolver(), key)
