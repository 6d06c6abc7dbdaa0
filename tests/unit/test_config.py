from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.config.hosts import Resolver
from nodeagent.config.identity import Account
from nodeagent.config.load import load_config, load_settings, read_config
from nodeagent.config.values import parse_duration
from nodeagent.errors import ConfigError
from tests.helpers.hosts import VALID, FixedResolver

ROOT = Path(__file__).resolve().parents[2]
NODEAGENT = Account("nodeagent", 990, 990, "/var/lib/nodeagent-worker")


def with_change(path: str, value: object) -> dict[str, Any]:
    data = copy.deepcopy(VALID)
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


def test_defaults_are_filled_in() -> None:
    config = load_config(VALID, FixedResolver())
    assert config.node.name == "gpu-node-07"
    assert config.node.address == "10.9.8.7"
    assert config.job.target_nodes == 4  # default: max_nodes
    assert config.job.nproc_per_node == 1
    assert config.timing.heartbeat_interval == 1.0
    assert config.timing.lease_ttl == 5.0
    assert config.redis.key_prefix == "nodeagent"
    assert config.metrics.listen == "127.0.0.1:9410"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("5s", 5.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("7d", 7 * 86400.0),
        ("1h30m", 5400.0),
        ("90m", 5400.0),
        ("1d12h", 129600.0),
        ("1h 30m", 5400.0),
        ("01:30:00", 5400.0),  # Slurm's HH:MM:SS
        ("90:00", 5400.0),  # MM:SS
        ("2-00:00:00", 172800.0),  # D-HH:MM:SS
        ("1-12", 129600.0),  # D-HH
        ("1-12:30", 131400.0),  # D-HH:MM
        ("1.5s", 1.5),
        (3, 3.0),
        (0.25, 0.25),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text, "timing.x") == seconds


@pytest.mark.parametrize(
    "text",
    ["5 parsecs", "-1s", "", True, [1], "fast", "1h30", "1:60:00", "1-24", "1:2:3:4", "5s5"],
)
def test_bad_durations_name_the_key(text: object) -> None:
    with pytest.raises(ConfigError) as err:
        parse_duration(text, "timing.lease_ttl")
    assert err.value.key == "timing.lease_ttl"


def test_pool_keep_ended_defaults_to_a_week_and_is_checked() -> None:
    pool_node = {k: v for k, v in VALID.items() if k != "job"}
    assert load_settings(pool_node, FixedResolver()).pool.keep_ended == 7 * 86400.0
    short = {**pool_node, "pool": {"keep_ended": "2h"}}
    assert load_settings(short, FixedResolver()).pool.keep_ended == 7200.0
    for bad in ("0s", "soon"):
        with pytest.raises(ConfigError) as err:
            load_settings({**pool_node, "pool": {"keep_ended": bad}}, FixedResolver())
        assert err.value.key == "pool.keep_ended"


@pytest.mark.parametrize(
    ("path", "value", "key", "words"),
    [
        ("job.min_nodes", 5, "job.min_nodes", "min_nodes (5) > max_nodes (4)"),
        ("job.target_nodes", 9, "job.target_nodes", "[2, 4]"),
        ("job.nproc_per_node", 0, "job.nproc_per_node", ">= 1"),
        ("job.nproc_per_node", "eight", "job.nproc_per_node", "expected int"),
        ("job.max_restarts", -1, "job.max_restarts", ">= 0"),
        ("job.entrypoint", "python train.py", "job.entrypoint", "list"),
        ("job.entrypoint", [], "job.entrypoint", "non-empty"),
        ("job.id", "", "job.id", "required"),
        ("job.id", "my job", "job.id", "letters"),
        ("job.id", "{x}", "job.id", "letters"),
        ("job.env", ["A=1"], "job.env", "mapping"),
        ("job.preload", "torch", "job.preload", "list of module names"),
        ("job.preload", ["torch nn"], "job.preload", "list of module names"),
        ("job.entrypoint", ["bash", "run.sh"], "job.preload", "needs a Python entrypoint"),
        ("job.colour", "blue", "job.colour", "unknown key"),
        ("timing.lease_ttl", "1s", "timing.lease_ttl", "twice heartbeat_interval"),
        ("timing.heartbeat_interval", "10ms", "timing.heartbeat_interval", "50ms"),
        ("timing.lease_tll", "5s", "timing.lease_tll", "unknown key"),
        ("timing.stop_grace_period", "soon", "timing.stop_grace_period", "duration"),
        ("redis.url", "http://x", "redis.url", "redis://"),
        ("redis.url", "", "redis.url", "required"),
        ("redis.key_prefix", "a b", "redis.key_prefix", "letters"),
        ("node.name", "node 1", "node.name", "letters"),
        ("node", "gpu1", "node", "mapping"),
        ("metrics.listen", "9410", "metrics.listen", "HOST:PORT"),
        ("log_dir", 5, "log_dir", "expected str"),
        ("surprise", 1, "surprise", "unknown key"),
        # 0 is an error where zero cannot work; `off` only where the docs say so
        ("timing.heartbeat_interval", 0, "timing.heartbeat_interval", "at least 50ms"),
        ("timing.heartbeat_interval", "off", "timing.heartbeat_interval", "cannot be off"),
        ("timing.heartbeat_interval", False, "timing.heartbeat_interval", "bare yes/no/on/off"),
        ("timing.lease_ttl", 0, "timing.lease_ttl", "more than 0"),
        ("timing.lease_ttl", "0s", "timing.lease_ttl", "more than 0"),
        ("timing.lease_ttl", "off", "timing.lease_ttl", "cannot be off"),
        ("timing.rendezvous_timeout", 0, "timing.rendezvous_timeout", "more than 0"),
        ("timing.rendezvous_timeout", False, "timing.rendezvous_timeout", "cannot be off"),
        ("timing.stop_grace_period", "off", "timing.stop_grace_period", "cannot be off"),
        ("timing.failure_stop_grace_period", False, "timing.failure_stop_grace_period", "off"),
        ("timing.join_settle", "off", "timing.join_settle", "cannot be off"),
        ("timing.hang_timeout", "-1s", "timing.hang_timeout", "duration"),
        ("timing.reform_timeout", "off", "timing.reform_timeout", "cannot be off"),
        ("timing.peer_timeout", "250ms", "timing.peer_timeout", "three times peer_interval"),
        ("timing.peer_timeout", "off", "timing.peer_timeout", "cannot be off"),
        ("timing.peer_phi", "0.5", "timing.peer_phi", "from 1 to 100"),
        ("timing.peer_phi", "eight", "timing.peer_phi", "Cassandra and Akka use 8"),
        ("timing.stopped_timeout", "soon", "timing.stopped_timeout", "duration"),
        ("timing.peer_interval", "5ms", "timing.peer_interval", "off or at least 10ms"),
        ("job.recovery", "inplace", "job.recovery", "restart, in_place, got 'inplace'"),
        ("job.recovery", True, "job.recovery", "expected str"),
        ("health.interval", 0, "health.interval", "at least 50ms"),
        ("health.interval", "off", "health.interval", "cannot be off"),
        ("health.gpu", "maybe", "health.gpu", "auto, on, off"),
        ("health.max_temperature_c", -5, "health.max_temperature_c", ">= 0"),
        ("health.max_pcie_replays", -1, "health.max_pcie_replays", ">= 0"),
        ("health.constrain_devices", "yes", "health.constrain_devices", "expected bool"),
        # Redis URLs: what redis-py would crash on or silently misread
        ("redis.url", "redis://h:abc/0", "redis.url", "port"),
        ("redis.url", "redis://h:99999/0", "redis.url", "port"),
        ("redis.url", "redis://h:0/0", "redis.url", "not 0"),
        ("redis.url", "redis://h/abc", "redis.url", "database must be a number"),
        ("redis.url", "redis://h/0?db=x", "redis.url", "database must be a number"),
        ("redis.url", "redis:///0", "redis.url", "names no host"),
        ("redis.url", "unix://", "redis.url", "names its socket"),
        ("redis.url", "unix:///r.sock?db=one", "redis.url", "database must be a number"),
        ("redis.url", "redis+sentinel://s1:26379", "redis.url", "names its service"),
        ("redis.url", "redis+sentinel://s1:26379/", "redis.url", "names its service"),
        ("redis.url", "redis+sentinel://s1:26379/m/abc", "redis.url", "database"),
        ("redis.url", "redis+sentinel://s1:26379/m/0/x", "redis.url", "too many parts"),
        ("redis.url", "redis+sentinel://s1:abc/m", "redis.url", "bad sentinel address"),
        ("redis.url", "redis+sentinel://s1:99999/m", "redis.url", "bad sentinel address"),
        ("redis.url", "redis+sentinel://s1,,s2/m", "redis.url", "bad sentinel address"),
        ("redis.url", "redis:/h:6379", "redis.url", "must start with"),
        # env: strings only; lists, maps, null and booleans are refused, naming the variable
        ("job.env", {"A": [1, 2]}, "job.env.A", "expected a string, got list"),
        ("job.env", {"A": None}, "job.env.A", "expected a string, got NoneType"),
        ("job.env", {"A": {"b": 1}}, "job.env.A", "expected a string, got dict"),
        ("job.env", {"A": True}, "job.env.A", "quote it"),
        ("job.env", {"A": "x\0y"}, "job.env.A", "expected a string"),
        ("job.env", {"": "x"}, "job.env.", "non-empty string without '='"),
        ("job.env", {"A=B": "x"}, "job.env.A=B", "without '='"),
        ("job.env", [], "job.env", "mapping"),
        ("job.env", "A=1", "job.env", "mapping"),
        ("job.entrypoint", [True], "job.entrypoint[0]", "quote it"),
        ("job.entrypoint", ["python", None], "job.entrypoint[1]", "expected a string"),
        ("job.entrypoint", ["python", ["x"]], "job.entrypoint[1]", "expected a string"),
        # paths
        ("job.working_dir", "", "job.working_dir", "expected a path"),
        ("job.working_dir", 7, "job.working_dir", "expected str"),
        ("log_dir", "", "log_dir", "expected a path"),
        ("log_dir", "/var/log/a\0b", "log_dir", "expected a path"),
        ("state_dir", "", "state_dir", "expected a path"),
        ("metrics.listen", "h:99999", "metrics.listen", "HOST:PORT"),
        ("metrics.listen", True, "metrics.listen", "expected str"),
    ],
)
def test_invalid_values_name_key_and_fix(path: str, value: object, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(with_change(path, value), FixedResolver())
    assert err.value.key == key
    assert words in str(err.value)


def test_document_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(["redis"], FixedResolver())


def test_unreadable_and_non_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        read_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("job: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_config(bad)


@pytest.mark.parametrize(
    "url",
    [
        "redis://10.0.0.2:6379/0",
        "rediss://user:pw@redis.example:6380/1",
        "unix:///run/redis/redis.sock",
        "redis+sentinel://s1:26379,s2:26379/mymaster/0",
    ],
)
def test_redis_url_schemes(url: str) -> None:
    assert load_config(with_change("redis.url", url), FixedResolver()).redis.url == url


class WithNodeagentUser(FixedResolver):
    """A node the Ansible role set up: it has the nodeagent user the example's workers run as."""

    def user(self, name: str) -> Account | None:
        return NODEAGENT if name == NODEAGENT.name else super().user(name)

    def groups_of(self, user: str, gid: int) -> tuple[int, ...]:
        return (gid,) if user == NODEAGENT.name else super().groups_of(user, gid)


def test_example_config_is_valid_and_documents_every_key() -> None:
    path = ROOT / "config" / "nodeagent.example.yaml"
    config = read_config(path, WithNodeagentUser())
    assert config.job.id == "llama-ft"
    example = yaml.safe_load(path.read_text())
    documented = {
        f"{section}.{key}"
        for section, body in example.items()
        if isinstance(body, dict)
        for key in body
    }
    sections = ("node", "redis", "job", "timing", "metrics", "health", "logging", "pool")
    for section in (*sections, "containers", "isolation"):
        fields = getattr(config, section).__dataclass_fields__
        missing = {f"{section}.{name}" for name in fields} - documented
        assert not missing, f"config/nodeagent.example.yaml does not document {missing}"


def test_resolver_picks_loopback_for_local_redis() -> None:
    assert Resolver().address_towards("redis://127.0.0.1:6379/0") == "127.0.0.1"
    assert Resolver().address_towards("unix:///tmp/redis.sock") == "127.0.0.1"


def test_logging_section() -> None:
    config = load_config(
        with_change("logging", {"format": "json", "level": "debug"}), FixedResolver()
    )
    assert (config.logging.format, config.logging.level) == ("json", "DEBUG")
    with pytest.raises(ConfigError, match="text or json"):
        load_config(with_change("logging.format", "xml"), FixedResolver())


@pytest.mark.parametrize(
    ("path", "value", "field", "expected"),
    [
        # 0 is zero where zero makes sense
        ("timing.stop_grace_period", 0, "timing.stop_grace_period", 0.0),
        ("timing.stop_grace_period", "0s", "timing.stop_grace_period", 0.0),
        ("timing.failure_stop_grace_period", 0, "timing.failure_stop_grace_period", 0.0),
        ("timing.join_settle", 0, "timing.join_settle", 0.0),
        ("timing.hang_timeout", 0, "timing.hang_timeout", 0.0),
        ("timing.hang_timeout", "off", "timing.hang_timeout", 0.0),
        ("timing.hang_timeout", False, "timing.hang_timeout", 0.0),  # YAML's bare off
        ("timing.hang_timeout", "5m", "timing.hang_timeout", 300.0),
        ("timing.stop_grace_period", None, "timing.stop_grace_period", 30.0),  # null: default
        ("health.max_temperature_c", 0, "health.max_temperature_c", 0.0),
        ("health.max_temperature_c", None, "health.max_temperature_c", None),
        ("health.max_pcie_replays", 0, "health.max_pcie_replays", 0),
        ("health.gpu", False, "health.gpu", "off"),  # YAML's bare off
        ("health.gpu", True, "health.gpu", "on"),  # YAML's bare on
        ("health.gpu", "off", "health.gpu", "off"),
        ("health.constrain_devices", True, "health.constrain_devices", True),
        ("metrics.listen", False, "metrics.listen", "off"),  # as the example documents it
        ("metrics.listen", "off", "metrics.listen", "off"),
        ("metrics.listen", ":9410", "metrics.listen", ":9410"),
        ("job.env", {"A": 1, "B": 0.5, "C": "x"}, "job.env", {"A": "1", "B": "0.5", "C": "x"}),
        ("job.env", None, "job.env", {}),
        ("job.entrypoint", ["python", "t.py", 2], "job.entrypoint", ("python", "t.py", "2")),
        ("redis.url", "redis://h:6380", "redis.url", "redis://h:6380"),
        ("redis.url", "redis://h/3?db=3", "redis.url", "redis://h/3?db=3"),
        ("redis.url", "redis://[::1]:6379/0", "redis.url", "redis://[::1]:6379/0"),
        ("redis.url", "unix:///r.sock?db=2", "redis.url", "unix:///r.sock?db=2"),
        ("redis.url", "redis+sentinel://s1,s2:2/m", "redis.url", "redis+sentinel://s1,s2:2/m"),
        ("redis.url", "redis+sentinel://[::1]:2/m/1", "redis.url", "redis+sentinel://[::1]:2/m/1"),
    ],
)
def test_zero_off_and_scalars_mean_what_they_say(
    path: str, value: object, field: str, expected: object
) -> None:
    config = load_config(with_change(path, value), FixedResolver())
    section, name = field.split(".")
    got = getattr(getattr(config, section), name)
    assert (dict(got) if isinstance(got, dict) else got) == expected


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cret@h:abc/0",
        "http://u:s3cret@h/0",
        "redis://u:s3cret@h/x",
        "redis://h/?password=s3cret&db=x",
    ],
)
def test_url_errors_never_show_the_password(url: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(with_change("redis.url", url), FixedResolver())
    assert err.value.key == "redis.url" and "s3cret" not in str(err.value)


@pytest.mark.parametrize(
    ("content", "key", "words"),
    [
        (b"job:\n  id: caf\xe9\n", "", "not UTF-8 text: byte 0xe9 on line 2"),
        (b"\xff\xfe", "", "not UTF-8"),
        (b"timing:\n  lease_ttl: 5s\n  lease_ttl: 1s\n", "timing.lease_ttl", "given twice"),
        (b"timing:\n  lease_ttl: 5s\n  lease_ttl: 1s\n", "timing.lease_ttl", "on line 3"),
        (b"job: {id: a}\njob: {id: b}\n", "job", "given twice"),
        (b"job:\n  env: {A: 1, A: 2}\n", "job.env.A", "given twice"),
        (b"x: [{a: 1, a: 2}]\n", "x[0].a", "given twice"),
        (b"job: [unclosed\n", "", "not valid YAML"),
    ],
)
def test_file_errors_name_key_and_fix(tmp_path: Path, content: bytes, key: str, words: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        read_config(path, FixedResolver())
    assert err.value.key == key
    assert words in str(err.value)


def test_bare_off_where_off_is_documented(tmp_path: Path) -> None:
    """`off` written bare, as config/nodeagent.example.yaml documents it, is YAML's false."""
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump(VALID)
        + "metrics: {listen: off}\nhealth: {gpu: off}\ntiming: {hang_timeout: off}\n"
    )
    config = read_config(path, FixedResolver())
    assert config.metrics.listen == "off" and config.health.gpu == "off"
    assert config.timing.hang_timeout == 0.0


def test_constraining_devices_needs_the_gpu_monitoring_that_says_which_are_a_jobs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**VALID, "health": {"gpu": "off", "constrain_devices": True}}))
    with pytest.raises(ConfigError) as err:
        read_config(path, FixedResolver())
    assert err.value.key == "health.constrain_devices"
    assert "needs GPU monitoring" in str(err.value) and "health.gpu auto or on" in str(err.value)


def test_aliases_and_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump(VALID)
        + "base: &b {heartbeat_interval: 1s, lease_ttl: 5s}\n"
        + "timing: {<<: *b, lease_ttl: 4s}\n"
    )
    with pytest.raises(ConfigError) as err:  # `base` is no key of ours: the document got this far
        read_config(path, FixedResolver())
    assert err.value.key == "base" and "unknown key" in str(err.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("/opt/py/bin/python3", "/opt/py/bin/python3"), ("python3", ConfigError)],
)
def test_job_python_is_an_absolute_path(value: str | None, expected: object) -> None:
    raw = copy.deepcopy(VALID)
    raw["job"]["python"] = value
    if expected is ConfigError:
        with pytest.raises(ConfigError, match=r"job\.python"):
            load_config(raw)
    else:
        assert load_config(raw).job.python == expected


@pytest.mark.parametrize(
    ("timing", "expected"),
    [
        ({}, (1.0, 60.0, 60.0)),
        ({"restart_backoff": "off"}, (0.0, 60.0, 60.0)),
        (
            {"restart_backoff": "500ms", "restart_backoff_max": "2m", "restart_backoff_reset": 0},
            (0.5, 120.0, 0.0),
        ),
    ],
)
def test_restart_backoff_keys(timing: dict[str, object], expected: tuple[float, ...]) -> None:
    raw = copy.deepcopy(VALID)
    raw["timing"] = {**raw.get("timing", {}), **timing}
    t = load_config(raw).timing
    assert (t.restart_backoff, t.restart_backoff_max, t.restart_backoff_reset) == expected


def test_restart_backoff_max_cannot_be_off() -> None:
    raw = copy.deepcopy(VALID)
    raw["timing"] = {"restart_backoff_max": "off"}
    with pytest.raises(ConfigError, match=r"timing\.restart_backoff_max"):
        load_config(raw)
