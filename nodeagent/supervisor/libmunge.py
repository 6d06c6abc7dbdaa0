"""libmunge in this process (ctypes): a credential encoded or decoded without a `munge` or
`unmunge` process per call.

Why: a program costs a fork and an exec, about 3 ms of a core, where libmunge's call is one
exchange with munged over its socket. On the CLI's path every request costs one of each (the
caller's `munge`, the pool leader's `unmunge`): 110 submissions a second on this 2-core machine
(bench/api.py). The calls used (munge_ctx_create/set/get/destroy, munge_encode, munge_decode)
are libmunge.so.2's since MUNGE 0.5 (2004), the soname unchanged since; Slurm links the same
library. Where it cannot be loaded (no libmunge2), the programs do the same work
(supervisor/munge.py): `munge_at` picks.

What is decoded is judged as unmunge's exit status is (model/credential.STATUS_OF_CODE), and a
text is first checked to be one credential and nothing more (model/credential.py): a NUL would
end the C string early, and text after it would pass unread.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_char_p, c_int, c_long, c_uint32, c_void_p
from dataclasses import dataclass

from nodeagent.model.credential import (
    STATUS_OF_CODE,
    Decoded,
    MungeStatus,
    MungeUnavailable,
    is_munge_credential,
)
from nodeagent.supervisor.munge import DEFAULT_SOCKET, UNREACHABLE, MungeProgram

SONAME = "libmunge.so.2"
# munge_opt_t (munge.h)
_OPT_TTL, _OPT_ENCODE_TIME, _OPT_SOCKET, _OPT_UID_RESTRICTION = 4, 6, 8, 9


class _Library:
    """libmunge's functions as typed here; libc's free for what they allocate."""

    def __init__(self, lib: ctypes.CDLL, libc: ctypes.CDLL) -> None:
        lib.munge_ctx_create.argtypes, lib.munge_ctx_create.restype = [], c_void_p
        lib.munge_ctx_destroy.argtypes, lib.munge_ctx_destroy.restype = [c_void_p], None
        lib.munge_ctx_strerror.argtypes, lib.munge_ctx_strerror.restype = [c_void_p], c_char_p
        lib.munge_strerror.argtypes, lib.munge_strerror.restype = [c_int], c_char_p
        # variadic: no argtypes, each argument is typed where it is passed
        lib.munge_ctx_set.restype = lib.munge_ctx_get.restype = c_int
        lib.munge_encode.argtypes = [POINTER(c_void_p), c_void_p, c_char_p, c_int]
        lib.munge_encode.restype = c_int
        lib.munge_decode.argtypes = [
            c_char_p,
            c_void_p,
            POINTER(c_void_p),
            POINTER(c_int),
            POINTER(c_uint32),  # uid_t
            POINTER(c_uint32),  # gid_t
        ]
        lib.munge_decode.restype = c_int
        libc.free.argtypes, libc.free.restype = [c_void_p], None
        self.lib, self.free = lib, libc.free


def load() -> _Library | None:
    """libmunge, or None where it cannot be loaded."""
    try:
        return _Library(ctypes.CDLL(SONAME), ctypes.CDLL(None))
    except (OSError, AttributeError):  # absent, or not the library its soname says
        return None


@dataclass(frozen=True)
class MungeLibrary:
    """The Munge protocol (model/credential.py) through libmunge, against the munged listening
    on `socket`."""

    library: _Library
    socket: str = DEFAULT_SOCKET

    def encode(
        self, payload: str, ttl_s: int | None = None, restrict_uid: int | None = None
    ) -> str:
        lib = self.library.lib
        ctx = self._context()
        try:
            if ttl_s is not None:
                self._set(ctx, _OPT_TTL, c_int(ttl_s))
            if restrict_uid is not None:
                self._set(ctx, _OPT_UID_RESTRICTION, c_uint32(restrict_uid))
            data = payload.encode()
            out = c_void_p()
            err = lib.munge_encode(byref(out), ctx, data, len(data))
            if err != 0:
                raise MungeUnavailable(self._why(ctx, err))
            try:
                return ctypes.string_at(out).decode("ascii").strip()
            finally:
                self.library.free(out)
        finally:
            lib.munge_ctx_destroy(ctx)

    def decode(self, credential: str) -> Decoded | MungeStatus:
        if not is_munge_credential(credential):
            return MungeStatus.MALFORMED
        lib = self.library.lib
        ctx = self._context()
        buf, length, uid, gid = c_void_p(), c_int(), c_uint32(), c_uint32()
        try:
            err = lib.munge_decode(
                credential.encode("ascii"), ctx, byref(buf), byref(length), byref(uid), byref(gid)
            )
            if err in UNREACHABLE:
                raise MungeUnavailable(self._why(ctx, err))
            status = STATUS_OF_CODE.get(err)
            if status is None:
                return MungeStatus.MALFORMED
            if not status.signed:
                return status
            encoded, ttl = c_long(), c_int()  # time_t
            if lib.munge_ctx_get(c_void_p(ctx), c_int(_OPT_ENCODE_TIME), byref(encoded)) != 0:
                return MungeStatus.MALFORMED
            if lib.munge_ctx_get(c_void_p(ctx), c_int(_OPT_TTL), byref(ttl)) != 0:
                return MungeStatus.MALFORMED
            data = ctypes.string_at(buf, length.value) if buf.value and length.value > 0 else b""
            payload = data.decode("utf-8", "replace")
            return Decoded(status, uid.value, gid.value, payload, encoded.value, ttl.value)
        finally:
            if buf.value:
                self.library.free(buf)
            lib.munge_ctx_destroy(ctx)

    def _context(self) -> int:
        ctx: int | None = self.library.lib.munge_ctx_create()
        if not ctx:
            raise MungeUnavailable("libmunge could not make a context (out of memory)")
        try:
            self._set(ctx, _OPT_SOCKET, c_char_p(self.socket.encode()))
        except MungeUnavailable:
            self.library.lib.munge_ctx_destroy(ctx)
            raise
        return ctx

    def _set(self, ctx: int, option: int, value: object) -> None:
        err = self.library.lib.munge_ctx_set(c_void_p(ctx), c_int(option), value)
        if err != 0:
            raise MungeUnavailable(self._why(ctx, err))

    def _why(self, ctx: int, err: int) -> str:
        said = self.library.lib.munge_ctx_strerror(ctx) or self.library.lib.munge_strerror(err)
        return f"munged at {self.socket}: {said.decode(errors='replace') if said else err}"


def munge_at(socket: str = DEFAULT_SOCKET) -> MungeLibrary | MungeProgram:
    """libmunge against `socket` where it loads, else the programs."""
    return MungeLibrary(_LIBRARY, socket) if _LIBRARY is not None else MungeProgram(socket)


_LIBRARY = load()
