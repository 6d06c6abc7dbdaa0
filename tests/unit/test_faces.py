"""Two faces over one body (issue 63): nodeagentctl's verbs and the API's routes come from
one table (views/table.py), and the committed OpenAPI document is the one the code makes.
Pure: the app is built, never served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.routing import APIRoute

from nodeagent.api.app import make_app, openapi_document
from nodeagent.cli.ctl.verbs import VERBS
from nodeagent.views.table import ROUTES

ROOT = Path(__file__).resolve().parents[2]


def test_every_verb_of_the_cli_is_a_row_of_the_table_and_no_other() -> None:
    assert list(VERBS) == list(ROUTES)


def test_the_api_serves_exactly_the_table_s_routes_each_under_its_verb() -> None:
    served = {
        (method, route.path, route.tags[0])
        for route in make_app(None).routes
        if isinstance(route, APIRoute) and route.path.startswith("/v1/")
        for method in route.methods or ()
    }
    table = {(r.method, r.path, verb) for verb, routes in ROUTES.items() for r in routes}
    assert served == table


def test_a_verb_without_a_route_or_a_route_without_a_verb_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nodeagent.api import routes
    from nodeagent.views import table

    extra = {**ROUTES, "purge": (table.Route("POST", "/v1/purge", "x"),)}
    monkeypatch.setattr(routes, "ROUTES", extra)
    try:
        make_app(None)
    except RuntimeError as exc:
        assert "routes without handlers: [('POST', '/v1/purge')]" in str(exc)
    else:
        raise AssertionError("a route without a handler was registered")


def test_the_committed_openapi_document_is_the_one_the_code_makes() -> None:
    committed = json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert committed == openapi_document(), (
        "docs/openapi.json is stale: `nodeagent api --openapi > docs/openapi.json`"
    )
