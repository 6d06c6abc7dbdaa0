"""XIDs the kernel logged before the agent started: a one-time scan of /dev/kmsg.

NVML's event set only reports XIDs raised after registration; the driver writes every XID to
the kernel log as `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

XID_RE = re.compile(r"NVRM: Xid \(((?:PCI:)?[0-9a-fA-F:.]+)\).*?: (\d+),")


@dataclass(frozen=True)
class KernelXid:
    bus_id: str  # normalized: lower case, no "PCI:" prefix, domain included
    xid: int


def normalize_bus_id(bus_id: str) -> str:
    """'PCI:0000:3B:00' and '00000000:3B:00.0' name the same device: '0000:3b:00'."""
    text = bus_id.lower().removeprefix("pci:")
    parts = text.split(":")
    if len(parts) == 3:
        domain, bus, rest = parts
        return f"{int(domain, 16):04x}:{bus}:{rest.split('.')[0]}"
    return text.split(".")[0]


def parse(lines: Iterable[str]) -> list[KernelXid]:
    found = []
    for line in lines:
        match = XID_RE.search(line)
        if match:
            found.append(KernelXid(normalize_bus_id(match.group(1)), int(match.group(2))))
    return found


def read_kmsg(path: Path = Path("/dev/kmsg"), limit: int = 100_000) -> list[str]:
    """Every record currently in the kernel ring buffer, without blocking. [] if unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    lines: list[str] = []
    try:
        while len(lines) < limit:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break  # end of the buffer
            except OSError:
                continue  # EPIPE: a record was overwritten while reading; go on
            if not record:
                break
            lines.append(record.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return lines
