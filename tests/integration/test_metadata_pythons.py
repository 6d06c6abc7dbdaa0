"""Issue 51: DCP metadata as each supported CPython pickles it reads, and nothing more.

Debian 12's /usr/bin/python3 (3.11.2, what a node's venv is made from) pickles an enum member by
name, `getattr(cls, name)`; 3.10, 3.11.7 and later, 3.12 and 3.13 by value, `cls(value)`. DCP's
`.metadata` holds enum members (`_MEM_FORMAT_ENCODING`), so the worker's unpickler refused every
save a node's own Python wrote. Here each form is read: hand-built pickles of a real save's
metadata at every protocol, and enum members pickled by each interpreter on this machine. Every
other `getattr` stays refused.
"""

from __future__ import annotations

import enum
import io
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodeagent.channel import tier

torch = pytest.importorskip("torch")

from nodeagent.worker import dcpio  # noqa: E402
from tests.helpers.safeload import reseal, restored, saved  # noqa: E402

_METADATA = "torch.distributed.checkpoint.metadata"
_PLANNER = "torch.distributed.checkpoint.planner"
# The enums DCP's metadata may hold, by module.
_ENUMS = {_METADATA: ("_MEM_FORMAT_ENCODING",), _PLANNER: ("LoadItemType", "WriteItemType")}


class _ByName(pickle.Pickler):
    """Pickles every enum member as CPython 3.11.0 to 3.11.4 does: `getattr(cls, name)`."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


class _Forged:
    """A pickle asking `getattr(target, name)` of anything a forger likes."""

    def __init__(self, target: Any, name: str) -> None:
        self.target, self.name = target, name

    def __reduce__(self) -> tuple[Any, tuple[Any, str]]:
        return getattr, (self.target, self.name)


def _by_name(obj: Any, protocol: int) -> bytes:
    out = io.BytesIO()
    _ByName(out, protocol=protocol).dump(obj)
    return out.getvalue()


def _unpickle(data: bytes) -> Any:
    return dcpio._MetadataUnpickler(io.BytesIO(data)).load()


def _memory_formats(metadata: Any) -> list[Any]:
    return [
        entry.properties.memory_format
        for entry in metadata.state_dict_metadata.values()
        if hasattr(entry, "properties")
    ]


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_a_save_whose_metadata_names_its_enums_by_name_restores(
    tmp_path: Path, protocol: int
) -> None:
    """A genuine save's `.metadata` rewritten in 3.11.2's form (at each protocol): it reads back
    equal, and the save restores instead of being refused."""
    memory = tmp_path / "m"
    saved(memory, 2, 4)
    slot = tier.newest_in_memory(memory, 0, step=4)
    assert slot is not None
    metadata = dcpio.read_metadata(slot)
    assert _memory_formats(metadata), "the save holds no tensor with a memory format"
    data = _by_name(metadata, protocol)
    assert b"getattr" in data  # the form under test, not the by-value one
    (slot / ".metadata").write_bytes(data)
    reseal(slot)

    assert dcpio.read_metadata(slot) == metadata
    step, epoch, refused = restored(tmp_path, "memory:4 memory:2 start")
    assert (step, epoch, refused) == (4, 2, [])


def _interpreters() -> list[str]:
    """Debian's own Python, and each supported CPython pyenv has on this machine."""
    found = [str(p) for p in [Path("/usr/bin/python3")] if p.exists()]
    pyenv = Path.home() / ".pyenv" / "versions"
    for minor in ("3.10", "3.11", "3.12", "3.13"):
        found += sorted(str(p) for p in pyenv.glob(f"{minor}.*/bin/python3"))
    return found or [sys.executable]


# Run by another interpreter, which has no torch: stand-in modules under the real names, the
# enums with DCP's names and values, so that its pickles name what DCP's would.
_PICKLE_ENUMS = """
import enum, pickle, sys, types
for package in ("torch", "torch.distributed", "torch.distributed.checkpoint"):
    sys.modules[package] = types.ModuleType(package)
metadata = types.ModuleType("torch.distributed.checkpoint.metadata")
planner = types.ModuleType("torch.distributed.checkpoint.planner")
members = {}
for module, name, values in [
    (metadata, "_MEM_FORMAT_ENCODING", %(formats)r),
    (planner, "LoadItemType", %(loads)r),
    (planner, "WriteItemType", %(writes)r),
]:
    cls = enum.Enum(name, values, module=module.__name__)
    setattr(module, name, cls)
    sys.modules[module.__name__] = module
    members.update({(name, m): cls[m] for m in values})
sys.stdout.buffer.write(pickle.dumps(members, protocol=int(sys.argv[1])))
"""


@pytest.mark.parametrize("python", _interpreters())
def test_enum_members_as_each_python_here_pickles_them_read_as_dcps(python: str) -> None:
    import importlib

    classes = {
        name: getattr(importlib.import_module(module), name)
        for module, names in _ENUMS.items()
        for name in names
    }

    def values(name: str) -> dict[str, Any]:
        return {m.name: m.value for m in classes[name]}

    script = _PICKLE_ENUMS % {
        "formats": values("_MEM_FORMAT_ENCODING"),
        "loads": values("LoadItemType"),
        "writes": values("WriteItemType"),
    }
    for protocol in (2, 4):
        data = subprocess.run(
            [python, "-I", "-c", script, str(protocol)], capture_output=True, check=True
        ).stdout
        members = _unpickle(data)
        expected = {(name, m.name): m for name, cls in classes.items() for m in cls}
        assert members == expected, (python, protocol)


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(lambda: _Forged("a string", "upper"), id="not-a-class"),
        pytest.param(lambda: _Forged(torch.Size, "count"), id="an-allowed-class-not-an-enum"),
        pytest.param(
            lambda: _Forged(torch.distributed.checkpoint.planner.LoadItemType, "__class__"),
            id="an-allowed-enum-not-a-member",
        ),
        pytest.param(
            lambda: _Forged(torch.distributed.checkpoint.planner.LoadItemType, "mro"),
            id="an-allowed-enums-method",
        ),
        pytest.param(lambda: _Forged(torch.float32, "to"), id="a-dtypes-attribute"),
    ],
)
def test_every_other_getattr_is_refused(forged: Any) -> None:
    import torch.distributed.checkpoint.planner  # noqa: F401  # the enums' module

    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        with pytest.raises(dcpio.Unsafe, match="not a member of an enum of DCP's metadata"):
            _unpickle(pickle.dumps(forged(), protocol=protocol))


def test_an_enum_outside_dcps_is_refused_by_name_and_by_value() -> None:
    """Allowing `getattr` opens no other enum: its class is still looked up first."""
    import http

    for data in (_by_name(http.HTTPStatus.OK, 4), pickle.dumps(http.HTTPStatus.OK, 4)):
        with pytest.raises(dcpio.Unsafe, match=r"http\.HTTPStatus is not part of DCP's metadata"):
            _unpickle(data)
