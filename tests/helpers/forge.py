"""What a forger does to a save: bytes changed so that their CRC-32 stays what the manifest says
(the attack a CRC-32 cannot see: issue 40). Four bytes at any offset can be chosen to give any
CRC-32, as in Nayuki's "forcecrc32"; arithmetic in GF(2)[x] modulo the CRC polynomial."""

from __future__ import annotations

import zlib

_POLY = 0x104C11DB7
_MASK = (1 << 32) - 1


def force_crc32(data: bytes, offset: int, crc: int) -> bytes:
    """`data` with the four bytes at `offset` changed so that its CRC-32 is `crc`."""
    patched = bytearray(data)
    delta = _reverse(zlib.crc32(patched) & _MASK) ^ _reverse(crc)
    delta = _mul(_inverse(_pow(2, (len(patched) - offset) * 8)), delta)
    change = _reverse(delta)
    for i in range(4):
        patched[offset + i] ^= (change >> (i * 8)) & 0xFF
    assert zlib.crc32(patched) & _MASK == crc
    return bytes(patched)


def _reverse(x: int) -> int:
    y = 0
    for _ in range(32):
        y, x = (y << 1) | (x & 1), x >> 1
    return y


def _mul(x: int, y: int) -> int:
    z = 0
    while y:
        z ^= x * (y & 1)
        y >>= 1
        x <<= 1
        if (x >> 32) & 1:
            x ^= _POLY
    return z


def _pow(x: int, y: int) -> int:
    z = 1
    while y:
        if y & 1:
            z = _mul(z, x)
        x = _mul(x, x)
        y >>= 1
    return z


def _divmod(x: int, y: int) -> tuple[int, int]:
    if x == 0:
        return 0, 0
    degree = y.bit_length() - 1
    z = 0
    for i in range(x.bit_length() - 1 - degree, -1, -1):
        if (x >> (i + degree)) & 1:
            x ^= y << i
            z |= 1 << i
    return z, x


def _inverse(x: int) -> int:
    y, x, a, b = x, _POLY, 0, 1
    while y:
        q, r = _divmod(x, y)
        x, y, a, b = y, r, b, a ^ _mul(q, b)
    assert x == 1
    return a & _MASK
