"""What a submitter asks to be told of (model/notify.py): Slurm's --mail-type kinds, what each
pool event says in them, and the signed body."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from nodeagent.errors import ConfigError
from nodeagent.model import notify
from nodeagent.model.notify import Notice, NotifyError
from nodeagent.model.pool import PoolJobState
from nodeagent.model.spec import load_spec


def test_kinds_parse_in_slurms_words_all_meaning_each() -> None:
    assert notify.parse("end,FAIL") == ("END", "FAIL")
    assert notify.parse("ALL") == notify.KINDS
    with pytest.raises(NotifyError, match="'MAIL' is not a kind to be told of: expected any of"):
        notify.parse("END,MAIL")


@pytest.mark.parametrize(
    ("event", "state", "kinds"),
    [
        ("job_admitted", PoolJobState.RUNNING, {"BEGIN"}),
        ("job_ended", PoolJobState.SUCCEEDED, {"END"}),
        ("job_ended", PoolJobState.FAILED, {"END", "FAIL"}),
        ("job_ended", PoolJobState.TIMEOUT, {"END", "TIME_LIMIT"}),
        ("job_ended", PoolJobState.CANCELLED, {"END"}),
        ("job_requeued", PoolJobState.PENDING, {"REQUEUE"}),
        ("job_evicted", PoolJobState.PENDING, {"REQUEUE"}),
        ("job_shrunk", PoolJobState.RUNNING, set()),
    ],
)
def test_each_pool_event_says_its_kinds(event: str, state: PoolJobState, kinds: set[str]) -> None:
    assert notify.kinds_of(event, state) == kinds


def test_the_body_is_signed_with_the_key_and_names_whom_to_tell() -> None:
    notice = Notice("1-0", "p", "llama", "alice", ("END",), "succeeded", "done", 5)
    body = notice.body()
    assert json.loads(body)["user"] == "alice" and json.loads(body)["delivery"] == "1-0"
    key = b"k" * 32
    assert (
        notify.signature(key, body) == "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
    )
    assert notify.signature(b"x" * 32, body) != notify.signature(key, body)


def test_a_spec_asks_by_kind_never_by_url() -> None:
    doc = {"id": "j", "entrypoint": ["x"], "user": "alice"}
    spec = load_spec({**doc, "notify": "END,FAIL"})
    assert spec.notify == ("END", "FAIL") and load_spec(spec.to_dict()) == spec
    with pytest.raises(ConfigError, match="notify: 'HTTPS://EVIL/' is not a kind"):
        load_spec({**doc, "notify": "https://evil/"})
