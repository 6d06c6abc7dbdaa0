"""This node's watch of its job's peers: beats served and heard over TCP, Redis not in the path.

Each agent listens on a port of its node's address (reported as `NodeReport.watch_port`, with
a random `watch_token`) and sends a 16-byte beat every `timing.peer_interval` to every
connection it accepted, and at once when what it says changes: the magic, the version, what the
agent's workers are doing (one byte, `tell`: job/ridethrough.py's `Said`) and the low 16 bits of
their generation, and the token. Those three bytes were padding in the first beats, which their
readers skip: agents of either kind hear each other (an older one says UNKNOWN). It dials each
peer it watches (job/suspicion.py: the job's other members), at the address and port that peer
reports, and reads its beats. A peer is suspected:
- at once when a connection that brought its beats ends: its agent died (a SIGKILL, an OOM
  kill) and the kernel closed its sockets, or its host reset the connection;
- when its silence since it was last heard is unlikely at the intervals its beats came at so
  far (job/accrual.py: the phi accrual detector, `timing.peer_phi`; 500 ms at the least, beats
  every 100 ms), or lasts `timing.peer_timeout` whatever they were: a host that lost power, a
  link down, a frozen agent.
A beat heard clears the suspicion. A peer never heard (its port unreachable: a firewall) is never
suspected, only warned of: its lease finds it, as without the watch. The watch thread judges
only the time it was itself running: after a pass that came late (this agent was starved or
stopped), it restarts every peer's silence rather than blame its peers for its own gap.

What is read, and from whom: only beats on connections this agent dialled, to the endpoint the
peer reported through Redis, each checked for the magic and that peer's token; the accepted
connections are never read. A beat can only clear a suspicion, never raise one, so a forger
(who must read the token from a served beat, and reach the port) can at worst make a dead peer
look alive: it is then lost at its lease, as without the watch. Ending a connection to a live
peer needs the peer's host or a forged reset on the path. Connections served are bounded
(SERVED_MAX); one past the bound is closed at once.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from nodeagent.job.accrual import Arrivals, Silence

log = logging.getLogger(__name__)
BEAT = struct.Struct("!4sBBH8s")  # magic, version, said, generation bits, the sender's token
MAGIC = b"NAbt"
VERSION = 1
SERVED_MAX = 1024  # connections served at once: far above a job's members (MAX_WATCHED)
READ_MAX = 4096  # bytes read from a dialled connection at a time


@dataclass(frozen=True)
class Peer:
    """A peer as its report names it: where its beats are served, and their token (hex)."""

    name: str
    address: str
    port: int
    token: str


@dataclass
class Heard:
    """What this watch knows of one peer (local clock)."""

    since: float  # when watching this endpoint began, or the last late pass
    last: float | None = None  # the last beat
    ended: bool = False  # a connection that brought beats ended, and none came since
    arrivals: Arrivals = field(default_factory=Arrivals)  # the intervals its beats came at

    def beat(self, now: float) -> None:
        if self.last is not None:
            self.arrivals.add(now - self.last)
        self.last, self.ended = now, False

    def silent(self, now: float, rule: Silence) -> bool:
        """Suspected: its connection ended, or its silence is suspect by `rule`. A peer never
        heard is not judged (a firewall that keeps this node from its port would otherwise
        hold it out of every generation): the lease finds it, and the watch says so
        (`unheard`)."""
        if self.ended:
            return True
        return self.last is not None and rule.suspect(now - self.last, self.arrivals)

    def unheard(self, now: float, timeout: float) -> bool:
        return self.last is None and not self.ended and now - self.since > timeout


@dataclass
class _Dial:
    peer: Peer
    heard: Heard
    sock: socket.socket | None = None
    connected: bool = False
    beats: int = 0  # beats this connection brought
    buffer: bytes = b""
    said: tuple[int, int] = (0, 0)  # what its last beat said: (state, generation bits)
    retry_at: float = 0.0
    warned: bool = False  # said that it is not heard


class PeerWatch:
    """The listener and the dialled connections, in a thread of their own."""

    def __init__(
        self,
        address: str,
        interval: float,
        timeout: float,
        wake: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        phi: float = 0.0,
    ) -> None:
        self.interval, self.timeout = interval, timeout
        self.rule = Silence(interval, timeout, phi)
        # A pass this late means this thread did not run (a starved or stopped agent): nobody's
        # silence over the gap is judged.
        self._late = max(2 * interval, self.rule.floor / 2)
        self._wake, self._clock = wake, clock
        self.token = secrets.token_hex(8)
        self._says = (0, 0)
        self._beat = BEAT.pack(MAGIC, VERSION, 0, 0, bytes.fromhex(self.token))
        self._told = False  # what it says changed: served at once
        self._listener = socket.create_server((address, 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._poke_r, self._poke_w = socket.socketpair()
        self._poke_r.setblocking(False)
        self._poke_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._poke_r, selectors.EVENT_READ, "poke")
        self._served: list[socket.socket] = []
        self._dials: dict[str, _Dial] = {}
        self._lock = threading.Lock()
        self._wanted: tuple[Peer, ...] | None = None
        self._suspects: frozenset[str] = frozenset()
        self._heard: frozenset[str] = frozenset()
        self._said: dict[str, tuple[int, int]] = {}
        self._last: dict[str, float] = {}  # when each peer's last beat was read
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="peer-watch", daemon=True)
        self._thread.start()

    # -- the agent's side (any thread) --------------------------------------------------------

    def watch(self, peers: Iterable[Peer]) -> None:
        """Watch exactly `peers` from now on (a peer whose endpoint changed is a new one)."""
        with self._lock:
            self._wanted = tuple(peers)
        self._poke()

    def suspects(self) -> frozenset[str]:
        with self._lock:
            return self._suspects

    def heard(self) -> frozenset[str]:
        """The peers whose beats the connection open to them has brought."""
        with self._lock:
            return self._heard

    def tell(self, said: int, bits: int) -> None:
        """What this agent's beats say from now on: its workers' state and the low 16 bits of
        their generation (job/ridethrough.py); sent at once when it changed."""
        says = (said & 0xFF, bits & 0xFFFF)
        with self._lock:
            if says == self._says:
                return
            self._says = says
            self._told = True
        self._poke()

    def said(self) -> dict[str, tuple[int, int]]:
        """What the last beat of each peer heard on its open connection said: (state,
        generation bits)."""
        with self._lock:
            return dict(self._said)

    def fresh(self, within: float) -> frozenset[str]:
        """The peers whose last beat came at most `within` seconds ago (any thread: a peer's
        last beat time is one float, written whole)."""
        now = self._clock()
        with self._lock:
            return frozenset(name for name, at in self._last.items() if now - at <= within)

    def close(self) -> None:
        self._stopped = True
        self._poke()
        self._thread.join(timeout=5)

    def _poke(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self._poke_w.send(b"\0")

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        next_beat = last_pass = self._clock()
        try:
            while not self._stopped:
                wait = max(0.0, min(next_beat - self._clock(), self.interval))
                for key, _ in self._selector.select(wait):
                    self._ready(key)
                now = self._clock()
                if now - last_pass > self._late:  # this thread was not running: judge
                    for dial in self._dials.values():  # nobody's silence over that gap
                        heard = dial.heard
                        heard.since = now
                        heard.last = now if heard.last is not None else None
                last_pass = now
                self._follow()
                if self._retold():
                    self._serve()
                if now >= next_beat:
                    next_beat = now + self.interval
                    self._serve()
                    self._redial(now)
                self._judge(now)
        except Exception:  # a bug here must not take the agent down: its leases still work
            log.exception("the peer watch stopped; peers are judged by their leases only")
        finally:
            self._shut()

    def _ready(self, key: selectors.SelectorKey) -> None:
        if key.data == "accept":
            self._accept()
        elif key.data == "poke":
            with contextlib.suppress(BlockingIOError, OSError):
                while self._poke_r.recv(4096):
                    pass
        elif isinstance(key.data, _Dial):
            self._on_dial(key.data)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: a pause, not a busy loop on select
                log.warning("peer watch cannot accept: %s", exc)
                time.sleep(self.interval)
                return
            if len(self._served) >= SERVED_MAX:
                conn.close()
                continue
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._served.append(conn)
            self._send(conn)  # at once: the dialler hears this node without waiting a beat

    def _send(self, conn: socket.socket) -> bool:
        try:
            conn.send(self._beat)
            return True
        except OSError:  # closed by the peer, or a full buffer (it does not read): drop it
            conn.close()
            return False

    def _serve(self) -> None:
        self._served = [conn for conn in self._served if self._send(conn)]

    def _retold(self) -> bool:
        """The beat made again if what it says changed (`tell`): whether it was."""
        with self._lock:
            if not self._told:
                return False
            self._told = False
            said, bits = self._says
        self._beat = BEAT.pack(MAGIC, VERSION, said, bits, bytes.fromhex(self.token))
        return True

    def _follow(self) -> None:
        with self._lock:
            wanted, self._wanted = self._wanted, None
        if wanted is None:
            return
        now = self._clock()
        peers = {peer.name: peer for peer in wanted}
        for name in list(self._dials):
            if name not in peers or peers[name] != self._dials[name].peer:
                self._drop(self._dials.pop(name))
        for name, peer in peers.items():
            if name not in self._dials:
                self._dials[name] = _Dial(peer, Heard(since=now))
        self._redial(now)

    def _redial(self, now: float) -> None:
        for dial in self._dials.values():
            if dial.sock is None and now >= dial.retry_at:
                self._dial(dial, now)

    def _dial(self, dial: _Dial, now: float) -> None:
        dial.retry_at = now + self.interval
        try:
            infos = socket.getaddrinfo(dial.peer.address, dial.peer.port, type=socket.SOCK_STREAM)
            family, kind, proto, _, where = infos[0]
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            log.debug("peer watch cannot reach %s: %s", dial.peer.name, exc)
            return
        sock.setblocking(False)
        code = sock.connect_ex(where)
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            return
        dial.sock, dial.connected, dial.beats, dial.buffer = sock, False, 0, b""
        self._selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, dial)

    def _on_dial(self, dial: _Dial) -> None:
        sock = dial.sock
        assert sock is not None
        if not dial.connected:
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                self._end(dial)
                return
            dial.connected = True
            self._selector.modify(sock, selectors.EVENT_READ, dial)
        try:
            data = sock.recv(READ_MAX)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._end(dial)
            return
        dial.buffer += data
        beats, said = dial.beats, dial.said
        while len(dial.buffer) >= BEAT.size:
            magic, version, state, bits, token = BEAT.unpack_from(dial.buffer)
            dial.buffer = dial.buffer[BEAT.size :]
            if magic != MAGIC or version != VERSION or token.hex() != dial.peer.token:
                log.warning("peer watch: %s's port serves no beats of its own", dial.peer.name)
                self._end(dial, heard=False)
                return
            dial.beats += 1
            dial.said = (state, bits)
        if dial.beats > beats:  # beats read at once count as one arrival: the read's time
            now = self._clock()
            dial.heard.beat(now)
            with self._lock:
                self._last[dial.peer.name] = now
                if dial.said != said:
                    self._said[dial.peer.name] = dial.said
            if dial.said != said:  # the agent acts on what its peers say: wake it
                self._wake()

    def _end(self, dial: _Dial, heard: bool = True) -> None:
        """The connection ended: if it brought beats, the peer is gone (module docstring)."""
        if heard and dial.beats:
            dial.heard.ended = True
        self._drop(dial)

    def _drop(self, dial: _Dial) -> None:
        with self._lock:
            self._said.pop(dial.peer.name, None)
            self._last.pop(dial.peer.name, None)
        dial.said = (0, 0)
        if dial.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(dial.sock)
            dial.sock.close()
        dial.sock, dial.connected = None, False

    def _judge(self, now: float) -> None:
        suspects = frozenset(
            name for name, dial in self._dials.items() if dial.heard.silent(now, self.rule)
        )
        heard = frozenset(name for name, dial in self._dials.items() if dial.beats)
        for name, dial in self._dials.items():
            if not dial.warned and dial.heard.unheard(now, self.timeout):
                dial.warned = True
                log.warning(
                    "peer watch: nothing heard from %s at %s:%d in %gs (a firewall?): it is "
                    "left to its lease",
                    *(name, dial.peer.address, dial.peer.port, self.timeout),
                )
        with self._lock:
            changed, self._suspects = suspects != self._suspects, suspects
            self._heard = heard
        if changed:
            self._wake()

    def _shut(self) -> None:
        for dial in self._dials.values():
            self._drop(dial)
        for conn in self._served:
            conn.close()
        self._selector.close()
        for sock in (self._listener, self._poke_r, self._poke_w):
            sock.close()
