from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.config import Resolver, load_config, parse_duration, read_config
from nodeagent.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


class FixedResolver(Resolver):
    def hostname(self) -> str:
        return "gpu-node-07"

    def address_towards(self, redis_url: str) -> str:
        return "10.9.8.7"


VALID: dict[str, Any] = {
    "redis": {"url": "redis://127.0.0.1:6379/0"},
    "job": {
        "id": "llama-ft",
        "entrypoint": ["python", "train.py"],
        "min_nodes": 2,
        "max_nodes": 4,
        "preload": ["torch"],
    },
}


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
    assert config.metrics.listen == "127.0.0.1:9400"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("5s", 5.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        (3, 3.0),
        (0.25, 0.25),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text, "timing.x") == seconds


@pytest.mark.parametrize("text", ["5 parsecs", "-1s", "", True, [1], "fast"])
def test_bad_durations_name_the_key(text: object) -> None:
    with pytest.raises(ConfigError) as err:
        parse_duration(text, "timing.lease_ttl")
    assert err.value.key == "timing.lease_ttl"


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
        ("metrics.listen", "9400", "metrics.listen", "HOST:PORT"),
        ("log_dir", 5, "log_dir", "expected str"),
        ("surprise", 1, "surprise", "unknown key"),
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


def test_example_config_is_valid_and_documents_every_key() -> None:
    path = ROOT / "config" / "nodeagent.example.yaml"
    config = read_config(path, FixedResolver())
    assert config.job.id == "llama-ft"
    example = yaml.safe_load(path.read_text())
    documented = {
        f"{section}.{key}"
        for section, body in example.items()
        if isinstance(body, dict)
        for key in body
    }
    for section in ("node", "redis", "job", "timing", "metrics", "health", "logging"):
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
