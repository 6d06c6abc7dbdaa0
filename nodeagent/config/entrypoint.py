"""The shape of a Python entrypoint (job.entrypoint), for preloading. Pure."""

from __future__ import annotations

from collections.abc import Sequence

OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})  # as in `-X importtime`


class NotPython(ValueError):
    """The entrypoint is not `python [options] script ...` or `python [options] -m module ...`."""


def split_python(argv: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(interpreter and its options, the script or `-m module` and its arguments)."""
    name = argv[0].rsplit("/", 1)[-1] if argv else ""
    if not name.startswith("python"):
        raise NotPython(f"{argv[0] if argv else 'nothing'} is not a python interpreter")
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            if i + 1 >= len(argv):
                raise NotPython("-m without a module")
            return tuple(argv[:i]), tuple(argv[i:])
        if arg in ("-c", "-"):
            raise NotPython(f"{arg} runs no script or module")
        if not arg.startswith("-"):
            return tuple(argv[:i]), tuple(argv[i:])
        i += 2 if arg in OPTIONS_WITH_VALUE else 1
    raise NotPython("no script or -m module")
