"""A change's request id (model/request.py): signed with its request, kept in a submission's
spec, and only ever an id; what pool.durability may be. Pure."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nodeagent.config.load import load_settings
from nodeagent.coord.durable import NotAcknowledged
from nodeagent.errors import ConfigError, CoordinationError, CorruptStateError
from nodeagent.model.request import Reply, Request, Verb, new_request_id
from nodeagent.model.spec import JobSpec, load_spec
from tests.helpers.hosts import VALID, FixedResolver


def test_a_request_id_is_signed_with_its_request_and_read_back() -> None:
    plain = Request("p", Verb.CANCEL, {"job": "j"}, nonce="n")
    keyed = replace(plain, request_id="r-1")
    assert keyed.digest != plain.digest  # the credential binds it: nobody moves it elsewhere
    assert "request_id" not in json.loads(plain.to_json())  # an older leader reads it as before
    back = Request.from_json(keyed.to_json())
    assert back == keyed and back.digest == keyed.digest
    assert len(new_request_id()) == 32 and new_request_id() != new_request_id()


@pytest.mark.parametrize("bad", ["a b", "x" * 129, "é", "../x"])
def test_a_request_id_that_is_not_one_is_garbage(bad: str) -> None:
    raw = json.loads(Request("p", Verb.CANCEL, {"job": "j"}).to_json())
    with pytest.raises(CorruptStateError, match="request_id"):
        Request.from_json(json.dumps({**raw, "request_id": bad}))


def test_a_submission_keeps_its_request_id_as_stored_and_a_document_cannot_set_it() -> None:
    doc = {"id": "j", "entrypoint": ["true"], "user": "alice"}
    stored = replace(load_spec(doc), request="r-1")
    assert JobSpec.from_json(stored.to_json()).request == "r-1"
    assert "request" not in load_spec(doc).to_dict()
    with pytest.raises(ConfigError, match="request"):
        load_spec({**doc, "request": "r-1"})  # a submitter's document: not its to set


def test_an_unacknowledged_reply_names_the_id_to_try_again_with() -> None:
    said = Reply(True, "job j submitted", "alice").as_unacknowledged("not on 1 replica", "r-1")
    assert not said.ok and said.unacknowledged and said.user == "alice"
    assert said.message == "not on 1 replica; run it again with --request-id r-1"
    assert Reply.from_json(said.to_json()).unacknowledged
    assert issubclass(NotAcknowledged, CoordinationError)  # nodeagentctl's 69, the API's 503


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"replicas": -1}, r"0 \(a single Redis\) to 16"),
        ({"replicas": 17}, r"0 \(a single Redis\) to 16"),
        ({"replicas": True}, r"0 \(a single Redis\) to 16"),
        ({"timeout": "2m"}, "at most 60s"),
        ({"copies": 1}, "copies"),
    ],
)
def test_pool_durability_is_checked(given: dict[str, object], problem: str) -> None:
    data = {**VALID, "pool": {"durability": given}}
    data.pop("job", None)
    with pytest.raises(ConfigError, match=problem):
        load_settings(data, FixedResolver())


def test_pool_durability_defaults_to_a_single_redis() -> None:
    data = {**VALID, "pool": {"durability": {"replicas": 1, "timeout": "500ms"}}}
    data.pop("job", None)
    durable = load_settings(data, FixedResolver()).pool.durability
    assert (durable.replicas, durable.timeout) == (1, 0.5)
