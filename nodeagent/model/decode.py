"""A strict reader for what nodeagent reads back from Redis. Pure.

Everything read from Redis is untrusted: another writer, a clumsy operator, or a bug may have put
anything there. Each value is checked for its JSON type (a real boolean, an integer that is an
integer: `2.9`, `"2"` and `true` are not integers), its range and, for numbers, finiteness (`1e999`,
`Infinity`, `NaN` are garbage). Whatever fails raises CorruptStateError naming the field, and
nothing else is raised: the callers report the value and ignore or repair it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from nodeagent.errors import CorruptStateError

MAX_RAW = 1 << 20  # bytes: far above anything nodeagent writes; more is garbage, not parsed
MAX_INT = (1 << 53) - 1  # exact in a Lua number, so Lua and Python agree on it
MAX_NAMES = 100_000  # members of a record
MAX_TEXT = 1 << 16  # characters of a free-text field (an error message, a reason)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # as config/load.py accepts node names
_ID_RE = re.compile(r"^(\d{1,20})-(\d{1,20})$")
_UINT_RE = re.compile(r"^\d{1,16}$")
_HOST_RE = re.compile(r"^[^\s\x00-\x1f\x7f/@?#]{1,253}$")  # no spaces, no URL parts
_REQUIRED: Any = object()  # a default meaning "the field must be present"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def loads(raw: str | bytes, what: str) -> Any:
    """JSON without NaN, Infinity or numbers that overflow to them.

    Raises:
        CorruptStateError: `raw` is too long, not UTF-8, not JSON, or nested too deeply.
    """
    if len(raw) > MAX_RAW:
        raise CorruptStateError(f"{what} is {len(raw)} bytes long, more than nodeagent writes")
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptStateError(f"{what} is not JSON: {_sample(raw)} ({exc})") from None


def _sample(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_stream_id(value: object) -> bool:
    """An entry ID such as `1700000000000-0`."""
    return isinstance(value, str) and _ID_RE.match(value) is not None


def stream_id_key(value: str) -> tuple[int, int]:
    """An entry ID as a sortable pair (IDs are ordered by their numbers, not as text)."""
    ms, seq = value.split("-")
    return int(ms), int(seq)


def parse_uint(raw: object) -> int | None:
    """A decimal integer string as nodeagent writes counters (rev, gen), else None."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    if isinstance(text, str) and _UINT_RE.match(text) and int(text) <= MAX_INT:
        return int(text)
    return None


class Reader:
    """Typed access to one decoded JSON object. Every accessor raises CorruptStateError naming
    `what` and the field when the value is not what it must be, or is missing (or null) and has
    no default."""

    def __init__(self, data: object, what: str) -> None:
        if not isinstance(data, dict):
            raise CorruptStateError(f"{what} is not a JSON object: {_sample(data)}")
        self.data: Mapping[str, Any] = data
        self.what = what
        self._read: set[str] = set()

    @classmethod
    def of(cls, raw: str | bytes, what: str) -> Reader:
        return cls(loads(raw, what), what)

    def unknown(self) -> list[str]:
        """Fields present but never read (written by something that is not this nodeagent)."""
        return sorted(set(self.data) - self._read)

    def _bad(self, name: str, value: object, expected: str) -> CorruptStateError:
        return CorruptStateError(
            f"{self.what}: field {name!r} is {_sample(value)}, expected {expected}"
        )

    def _get(self, name: str, default: Any) -> tuple[Any, bool]:
        """The value and True, or `default` and False when missing or null."""
        self._read.add(name)
        value = self.data.get(name)
        if value is not None:
            return value, True
        if default is _REQUIRED:
            raise self._bad(name, value, "a value")
        return default, False

    def integer(
        self, name: str, default: Any = _REQUIRED, low: int = 0, high: int = MAX_INT
    ) -> Any:
        """An integer in [low, high] (a JSON integer: not 2.0, "2" or true)."""
        value, present = self._get(name, default)
        if present and (
            not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high
        ):
            raise self._bad(name, value, f"an integer in [{low}, {high}]")
        return value

    def opt_integer(self, name: str, low: int = 0, high: int = MAX_INT) -> int | None:
        result: int | None = self.integer(name, None, low, high)
        return result

    def number(self, name: str, low: float = -1e12, high: float = 1e12) -> float | None:
        """An optional finite number (integers too) in [low, high]."""
        value, present = self._get(name, None)
        if not present:
            return None
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._bad(name, value, "a number")
        if not (math.isfinite(value) and low <= value <= high):
            raise self._bad(name, value, f"a finite number in [{low:g}, {high:g}]")
        return float(value)

    def real(self, name: str, low: float = -1e12, high: float = 1e12) -> float:
        """A finite number (integers too) in [low, high] that must be present."""
        value = self.number(name, low, high)
        if value is None:
            raise self._bad(name, value, f"a finite number in [{low:g}, {high:g}]")
        return value

    def flag(self, name: str, default: Any = _REQUIRED) -> bool:
        """A JSON boolean: "false", 0 and 1 are not booleans."""
        value, present = self._get(name, default)
        if present and not isinstance(value, bool):
            raise self._bad(name, value, "true or false")
        return bool(value)

    def text(self, name: str, default: Any = _REQUIRED, max_len: int = MAX_TEXT) -> Any:
        value, present = self._get(name, default)
        if present and (not isinstance(value, str) or len(value) > max_len):
            raise self._bad(name, value, f"a string of at most {max_len} characters")
        return value

    def opt_text(self, name: str, max_len: int = MAX_TEXT) -> str | None:
        result: str | None = self.text(name, None, max_len)
        return result

    def choice(self, name: str, choices: tuple[str, ...], default: Any = _REQUIRED) -> Any:
        value = self.text(name, default, 64)
        if value is not None and value not in choices:
            raise self._bad(name, value, f"one of {', '.join(choices)}")
        return value

    def name(self, name: str) -> str:
        """A node name (what config/load.py accepts for node.name)."""
        value = self.text(name, max_len=64)
        if not NAME_RE.match(value):
            raise self._bad(name, value, "a node name")
        return str(value)

    def host(self, name: str, default: Any = _REQUIRED) -> Any:
        """A host name or IP address (no spaces, no URL): what a worker may connect to."""
        value = self.text(name, default, 253)
        if value and not _HOST_RE.match(value):
            raise self._bad(name, value, "a host name or an IP address")
        return value

    def stream_id(self, name: str, default: str) -> str:
        value = self.text(name, default, 41)
        if not is_stream_id(value):
            raise self._bad(name, value, "a stream entry ID such as 1700000000000-0")
        return str(value)

    def obj(self, name: str) -> Reader | None:
        """An optional nested object."""
        value, present = self._get(name, None)
        return Reader(value, f"{self.what}: {name}") if present else None

    def raw(self, name: str) -> Any:
        """An optional value as it was read (None when missing or null): the caller checks it."""
        return self._get(name, None)[0]

    def items(self, name: str, max_items: int = MAX_NAMES) -> list[Any]:
        """An optional list (empty when missing)."""
        value, present = self._get(name, None)
        if not present:
            return []
        if not isinstance(value, list) or len(value) > max_items:
            raise self._bad(name, value, f"a list of at most {max_items} items")
        return value

    def objects(self, name: str, max_items: int = 4096) -> list[Reader]:
        return [
            Reader(item, f"{self.what}: {name}[{i}]")
            for i, item in enumerate(self.items(name, max_items))
        ]

    def names(self, name: str) -> tuple[str, ...]:
        """A list of distinct node names."""
        values = self.items(name)
        if not all(isinstance(v, str) and NAME_RE.match(v) for v in values):
            raise self._bad(name, values, "a list of node names")
        if len(set(values)) != len(values):
            raise self._bad(name, values, "distinct node names")
        return tuple(values)

    def generations(self, name: str) -> tuple[tuple[str, int], ...]:
        """A list of [node name, generation] pairs, each node named once."""
        values = self.items(name)
        if not all(
            isinstance(v, list)
            and len(v) == 2
            and isinstance(v[0], str)
            and NAME_RE.match(v[0])
            and isinstance(v[1], int)
            and not isinstance(v[1], bool)
            and 0 <= v[1] <= MAX_INT
            for v in values
        ):
            raise self._bad(name, values, "a list of [node name, generation] pairs")
        if len({v[0] for v in values}) != len(values):
            raise self._bad(name, values, "each node named once")
        return tuple((str(v[0]), int(v[1])) for v in values)

    def mapping(self, name: str) -> Mapping[str, Any]:
        """An optional object, as a plain mapping (event data): never a list or a string."""
        value, present = self._get(name, None)
        if not present:
            return {}
        if not isinstance(value, dict):
            raise self._bad(name, value, "a JSON object")
        return value
