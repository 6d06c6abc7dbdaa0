"""The value rules every section of the config shares, and typed access to one mapping.

Each rule rejects a bad value with the dotted name of its key (ConfigError), so the daemons can
exit 78 naming what to fix.
"""

from __future__ import annotations

import math
import re
import signal
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from nodeagent.errors import ConfigError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# Slurm's time formats: [D-]HH:MM:SS, MM:SS, D-HH, D-HH:MM (sbatch --time)
_CLOCK_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")
DURATION_FORMS = "such as 30s, 500ms, 90m, 1h30m, 2d or Slurm's [D-]HH:MM:SS"
YAML_BOOLEANS = "YAML reads a bare yes/no/on/off/true/false as a boolean"
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([KMGT])(i?)B?|B)?\s*$", re.IGNORECASE)
_SIZE_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_duration(value: object, key: str) -> float:
    """Seconds from a number (seconds) or a string: units summed ("500ms", "5s", "90m",
    "1h30m", "2d", "1d12h"; a bare number is seconds) or Slurm's clock forms ("MM:SS",
    "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS"). Every duration nodeagent takes (its config,
    a job spec, nodeagentctl's flags) is read by this one function.

    Raises:
        ConfigError: naming `key` when the value is not a non-negative duration.
    """
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a duration {DURATION_FORMS}, got {value!r}")
    if isinstance(value, int | float):
        seconds: float | None = float(value)
    else:
        seconds = _duration_text(value.strip()) if isinstance(value, str) else None
    if seconds is None:
        raise ConfigError(key, f"expected a duration {DURATION_FORMS}, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(key, f"expected a non-negative duration, got {value!r}")
    return seconds


def _duration_text(text: str) -> float | None:
    """Seconds from units ("1h30m", a bare number: seconds) or a clock form; None if neither."""
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    compact = text.replace(" ", "")
    parts = _DURATION_PART.findall(compact)
    if parts and "".join(n + u for n, u in parts) == compact:
        return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    match = _CLOCK_RE.match(text)
    if match is None or (":" not in text and "-" not in text):
        return None
    days, first, second, third = match.groups()
    if days is None and third is None:  # MM:SS, any number of minutes (as Slurm's)
        return None if int(second) >= 60 else int(first) * 60.0 + int(second)
    hours, minutes, seconds = int(first), int(second or 0), int(third or 0)  # [D-]HH[:MM[:SS]]
    if minutes >= 60 or seconds >= 60 or (days is not None and hours >= 24):
        return None
    return int(days or 0) * 86400.0 + hours * 3600.0 + minutes * 60.0 + seconds


def format_duration(seconds: float) -> str:
    """A duration as parse_duration reads it back, in its largest units: 1h30m, 2d, 45s."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    left, parts = round(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts)


SIGNAL_BEFORE_S = 60.0  # Slurm's default of --signal's @time


def parse_signal(value: object, key: str) -> tuple[str, float]:
    """A signal and how long before the time limit it is sent, from "USR1@300", "SIGUSR1@5m",
    "10@300" or "USR1" (60 s before, as Slurm's --signal); the name without SIG.

    Raises:
        ConfigError: naming `key`: not a signal a worker can catch, or a bad duration.
    """
    text = str(value).strip() if isinstance(value, str | int) else ""
    name, at, before = text.partition("@")
    found: signal.Signals | None = None
    try:
        found = signal.Signals(int(name)) if name.isdigit() else signal.Signals[_sig(name)]
    except (ValueError, KeyError):
        found = None
    if found is None or found in (signal.SIGKILL, signal.SIGSTOP):
        raise ConfigError(
            key,
            f"expected SIGNAL[@TIME] with a signal a worker can catch, such as USR1@300 or "
            f"TERM@5m, got {value!r}",
        )
    seconds = parse_duration(before, key) if at else SIGNAL_BEFORE_S
    return found.name.removeprefix("SIG"), seconds


def _sig(name: str) -> str:
    upper = name.upper()
    return upper if upper.startswith("SIG") else f"SIG{upper}"


def parse_size(value: object, key: str) -> int:
    """Bytes from a number or a string such as "512MiB", "8GiB", "2G" (KiB and K are 1024,
    as df and systemd's MemoryMax= read them; a bare number is bytes).

    Raises:
        ConfigError: naming `key` when the value is not a positive size.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = _SIZE_RE.match(value) if isinstance(value, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(key, f"expected a size such as 8GiB or 512MiB, got {value!r}")
    power = _SIZE_POWERS[(match.group(2) or "").lower()]
    return int(float(match.group(1)) * 1024**power)


def size_text(size: int) -> str:
    """A size as an operator writes one: "64 GiB", "1.5 GiB", "512 MiB", "4096 B"."""
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if size >= 1024**power:
            return f"{size / 1024**power:.4g} {unit}"
    return f"{size} B"


def duration(
    raw: object,
    key: str,
    default: float,
    *,
    minimum: float = 0.0,
    positive: bool = False,
    off: bool = False,
) -> float:
    """A duration key: absent or null is `default`, 0 is zero (an error where `positive`),
    `off` (or the false YAML makes of a bare off) is 0 where `off` is documented and an error
    elsewhere; a value below `minimum` is an error.

    Raises:
        ConfigError: naming `key`.
    """
    if raw is None:
        return default
    if raw is False or raw == "off":
        if off:
            return 0.0
        raise ConfigError(
            key,
            f"cannot be off; give a duration such as 5s or 500ms (got {raw!r}; {YAML_BOOLEANS})",
        )
    seconds = parse_duration(raw, key)
    if positive and seconds == 0:
        raise ConfigError(key, f"must be more than 0, got {raw!r}")
    if seconds < minimum:
        raise ConfigError(key, f"must be at least {minimum * 1000:g}ms, got {raw!r}")
    return seconds


T = TypeVar("T")


class Section:
    """Typed access to one mapping of the YAML document; remembers which keys were used."""

    def __init__(self, data: object, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(path, f"expected a mapping, got {type(data).__name__}")
        self._data: Mapping[str, Any] = data
        self.path = path
        self._known: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    @property
    def present(self) -> bool:
        """The mapping has any key (an absent or null section has none)."""
        return bool(self._data)

    def get(self, name: str, kind: type[T], default: T) -> T:
        self._known.add(name)
        if name not in self._data or self._data[name] is None:
            return default
        value = self._data[name]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)  # type: ignore[return-value]
        if not ok:
            raise ConfigError(
                self.key(name), f"expected {kind.__name__}, got {type(value).__name__} {value!r}"
            )
        return value  # type: ignore[no-any-return]

    def raw(self, name: str) -> object:
        self._known.add(name)
        return self._data.get(name)

    def section(self, name: str) -> Section:
        self._known.add(name)
        return Section(self._data.get(name), self.key(name))

    def reject_unknown(self) -> None:
        unknown = sorted(set(map(str, self._data)) - self._known)
        if unknown:
            raise ConfigError(
                self.key(unknown[0]),
                f"unknown key; known keys here are: {', '.join(sorted(self._known))}",
            )


def check_name(value: str, key: str) -> str:
    if not _NAME_RE.match(value):
        raise ConfigError(
            key, f"{value!r} must be 1-63 letters, digits, '.', '_' or '-' (no spaces, braces)"
        )
    return value


def positive_int(section: Section, name: str, default: int, minimum: int = 1) -> int:
    value = section.get(name, int, default)
    if value < minimum:
        raise ConfigError(section.key(name), f"must be >= {minimum}, got {value}")
    return value


def choice(
    section: Section, name: str, allowed: Sequence[str], default: str, hint: str = ""
) -> str:
    """A string key that must be one of `allowed`; `hint` (what each means) ends the error."""
    value = section.get(name, str, default)
    if value not in allowed:
        raise ConfigError(
            section.key(name),
            f"must be one of {', '.join(allowed)}, got {value!r}" + (f" ({hint})" if hint else ""),
        )
    return value


def path_value(section: Section, name: str, default: str) -> str:
    """A file system path: a non-empty string without NUL (which no system call takes)."""
    value = section.get(name, str, default)
    if not value or "\0" in value:
        raise ConfigError(section.key(name), f"expected a path, got {value!r}")
    return value


def optional_path(section: Section, name: str) -> str | None:
    """A path key whose absence (or null) means "the default"; an empty string is an error."""
    return None if section.raw(name) is None else path_value(section, name, "")


def optional_limit(section: Section, name: str, kind: type[T]) -> T | None:
    """A limit that is absent (None: the default) or a finite number >= 0."""
    if section.raw(name) is None:
        return None
    value = section.get(name, kind, kind())
    if not 0 <= value < math.inf:  # type: ignore[operator]
        raise ConfigError(section.key(name), f"must be a number >= 0, got {value!r}")
    return value


def not_a_string(value: object) -> str:
    hint = f"; quote it ({YAML_BOOLEANS})" if isinstance(value, bool) else ""
    return f"expected a string, got {type(value).__name__} {value!r}{hint}"


def env_scalar(value: object) -> bool:
    """A string, or a number that stands for its own text; not a boolean, null or collection."""
    return isinstance(value, str | int | float) and not isinstance(value, bool)
