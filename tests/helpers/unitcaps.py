"""A root process with the shipped unit's privileges, without systemd: the capability bounding
set, NoNewPrivileges and UMask that `systemd/nodeagent.service` gives the agent, read from the
unit itself (so the tests follow it), applied with util-linux's `setpriv`.

Root with a bounding set that lacks CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER is
held to the files' modes as any user is: what the agent does under its unit. The booted-node
suite (tests/booted) runs the unit itself; this is the cheap stand-in for a single program.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "nodeagent.service"


def unit_setting(name: str, unit: Path = UNIT) -> str:
    """The value of `name=` in the unit (the last one, as systemd reads a setting given once)."""
    found = re.findall(rf"^{re.escape(name)}=(.*)$", unit.read_text(), re.MULTILINE)
    assert found, f"{unit} sets no {name}="
    return str(found[-1]).strip()


def unit_prefix(unit: Path = UNIT, extra: Sequence[str] = ()) -> list[str]:
    """A command prefix that runs what follows as root with the unit's capabilities (its
    CapabilityBoundingSet, and `extra` ones a drop-in adds), no new privileges, and its umask."""
    if shutil.which("setpriv") is None:
        pytest.skip("util-linux's setpriv is needed")
    bounding = [*unit_setting("CapabilityBoundingSet", unit).split(), *extra]
    caps = [c.removeprefix("CAP_").lower() for c in bounding]
    umask = unit_setting("UMask", unit)
    no_new = ["--no-new-privs"] if unit_setting("NoNewPrivileges", unit) == "yes" else []
    return [
        "setpriv",
        "--bounding-set=-all," + ",".join(f"+{c}" for c in caps),
        "--inh-caps=-all",
        *no_new,
        "--",
        "sh",
        "-c",
        f'umask {umask} && exec "$@"',
        "unit",
    ]
