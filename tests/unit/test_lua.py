"""coord/lua.py: a script's keys and arguments are named once, and passed in that order."""

from __future__ import annotations

import re

import pytest

from nodeagent.coord import poolscripts, scripts
from nodeagent.coord.lua import Call, Script

ECHO = Script("ECHO", keys=("a", "b"), args=("x", "y"), returns="its ARGV", body="return ARGV")


def test_keys_and_arguments_go_in_the_scripts_order_whatever_the_callers() -> None:
    call = Call({"b": "kb", "a": "ka"}, {"y": 2, "x": 1}, ["r1", "r2"])
    assert ECHO.call_args(call) == (["ka", "kb"], [1, 2, "r1", "r2"])


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (Call({"a": "ka"}, {"x": 1, "y": 2}), "keys"),
        (Call({"a": "ka", "b": "kb", "c": "kc"}, {"x": 1, "y": 2}), "keys"),
        (Call({"a": "ka", "b": "kb"}, {"x": 1}), "arguments"),
        (Call({"a": "ka", "b": "kb"}, {"x": 1, "y": 2, "z": 3}), "arguments"),
    ],
)
def test_a_missing_or_unknown_name_is_refused(call: Call, problem: str) -> None:
    with pytest.raises(ValueError, match=f"ECHO: {problem}"):
        ECHO.call_args(call)


def test_the_prologue_binds_each_name_to_its_position() -> None:
    source = ECHO.source
    assert "local K = {a = KEYS[1], b = KEYS[2]}" in source
    assert "local A = {x = ARGV[1], y = ARGV[2]}" in source
    assert "local REST = 3" in source


def test_a_name_that_is_no_lua_identifier_is_refused() -> None:
    with pytest.raises(ValueError, match="'change-seq' is not a Lua identifier"):
        Script("BAD", keys=("change-seq",), args=(), returns="", body="")


SCRIPTS = [v for m in (scripts, poolscripts) for v in vars(m).values() if isinstance(v, Script)]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_every_script_reads_only_names_it_declares(script: Script) -> None:
    """No positional KEYS[n] or literal ARGV[n] left, and every K.x / A.x it reads is declared
    (a misspelt name would read nil in Lua, not fail)."""
    body = script.body
    assert not re.findall(r"KEYS\[", body)
    assert not re.findall(r"ARGV\[\d+\]", body)
    assert set(re.findall(r"\bK\.(\w+)", body)) <= set(script.keys)
    assert set(re.findall(r"\bA\.(\w+)", body)) <= set(script.args)
