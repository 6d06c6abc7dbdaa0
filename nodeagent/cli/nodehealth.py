"""`nodeagent health [--config PATH] [--json]`: a node-local GPU preflight.

No Redis and no running agent: one fresh reading of this node's GPUs (NVML, or the config's
`health.fake_gpus`), judged by the rules the agent uses (gpu/classify.py with the config's
thresholds, gpu/policy.py for what the agent would do about them). The Ansible role runs it
before it starts or restarts the agent.

Exit codes:
  0   every GPU usable (healthy or degraded)
  1   the agent would cordon and drain this node (a GPU to drain, reset or reboot), or the
      node has fewer usable GPUs than its job: section needs (nproc_per_node x
      gpus_per_worker; a pool node's config has no job: and no such check)
  3   GPU monitoring unavailable: no NVIDIA driver, NVML missing, or `health.gpu: off`
  78  the config file cannot be read, its `health:` or `node:` section is invalid, or
      `health.gpu: on` without NVML (`nodeagent run` exits 78 there too)

Without --config the default file is read if it exists; if not, the default health settings
apply (NVML if it works). A config that is invalid only elsewhere (say an unknown job.user)
does not stop the check: its `health:` section still says how to judge the GPUs, the error
is a warning (and `config_error` in the JSON), and `nodeagent config check` is the command
for it. The job's GPU count is then unknown and not checked.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nodeagent.cli.ctl.output import print_health
from nodeagent.config import strictyaml
from nodeagent.config.hosts import Resolver
from nodeagent.config.load import _load_health as load_health_section  # the section on its own
from nodeagent.config.load import read_settings
from nodeagent.config.settings import EX_CONFIG, HealthConfig
from nodeagent.config.values import Section, check_name
from nodeagent.errors import ConfigError
from nodeagent.gpu.classify import Thresholds, Verdict, classify
from nodeagent.gpu.nvml import GpuUnavailable, NvmlBackend, load_pynvml
from nodeagent.gpu.policy import GpuDecision, decide_gpus
from nodeagent.gpu.probe import probe
from nodeagent.gpu.readings import GpuReading, GpuSnapshot

HEALTHY, UNHEALTHY, UNAVAILABLE = 0, 1, 3
CHECKED_SECTIONS = ("health", "node")  # an error there stops the check (exit 78)


@dataclass(frozen=True)
class Settings:
    node: str
    health: HealthConfig
    gpus_needed: int | None  # None: no job section (none, a pool node, or invalid)
    config_error: str | None = None  # the config is invalid outside CHECKED_SECTIONS


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], default_config: str
) -> None:
    """The `health` subcommand on the `nodeagent` parser's subparsers."""
    health = commands.add_parser(
        "health",
        help="check this node's GPUs now, without Redis or the agent; exit 0 all usable, "
        "1 unhealthy, 3 no GPU monitoring, 78 invalid config",
    )
    health.add_argument(
        "--config",
        help=f"config file for its health: settings (default {default_config}; "
        "default settings if that does not exist)",
    )
    health.add_argument("--json", action="store_true", help="one JSON document")


def run(args: argparse.Namespace, default_config: str) -> int:
    try:
        settings = load_settings(args.config, default_config)
    except ConfigError as exc:
        print(f"nodeagent: invalid configuration: {exc}", file=sys.stderr)
        return EX_CONFIG
    if settings.config_error is not None:
        print(
            f"nodeagent: warning: invalid configuration ({settings.config_error}); the GPUs "
            "are checked with its health: section (`nodeagent config check` for the rest)",
            file=sys.stderr,
        )
    snapshot = read_gpus(settings.health)
    verdicts = [classify(r, _thresholds(settings.health)) for r in snapshot.gpus]
    units = {g.index: len(g.mig_devices) for g in snapshot.gpus if g.mig}  # MIG: instances
    decision = decide_gpus(
        snapshot.available, verdicts, [], None, [], settings.gpus_needed or 0, False, units
    )
    code = exit_code(settings.health, snapshot, decision)
    if code == EX_CONFIG:
        print(
            f"nodeagent: invalid configuration: health.gpu: 'on', but GPU monitoring is "
            f"unavailable: {snapshot.reason}",
            file=sys.stderr,
        )
    doc = report(settings, snapshot, verdicts, decision, code)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print_table(doc)
    return code


def load_settings(path: str | None, default_config: str) -> Settings:
    """The node's name, health settings and GPU count from the config (see the module doc).

    Raises:
        ConfigError: the file cannot be read, or its health: or node: section is invalid.
    """
    if path is None and not Path(default_config).exists():
        return Settings(Resolver().hostname(), HealthConfig(), None)
    path = path or default_config
    try:
        config = read_settings(path)
    except ConfigError as exc:
        section = exc.key.split(".")[0].split("[")[0]
        if not section or section in CHECKED_SECTIONS:
            raise
        node, health = _read_sections(path)
        return Settings(node, health, None, str(exc))
    job = config.job
    needed = job.nproc_per_node * job.gpus_per_worker if job is not None else None
    return Settings(config.node.name, config.health, needed)


def _read_sections(path: str) -> tuple[str, HealthConfig]:
    """node.name and the health: section alone, of a file read_settings has already parsed."""
    root = Section(strictyaml.load(Path(path).read_text(encoding="utf-8")), "")
    node = root.section("node")
    name = check_name(node.get("name", str, Resolver().hostname()), node.key("name"))
    return name, load_health_section(root.section("health"))


def _thresholds(health: HealthConfig) -> Thresholds:
    return Thresholds(health.max_temperature_c, health.max_ecc_uncorrected, health.max_pcie_replays)


def read_gpus(health: HealthConfig) -> GpuSnapshot:
    """One fresh reading through the backend the agent would use."""
    if health.gpu == "off":
        return GpuSnapshot(available=False, reason="health.gpu is off")
    try:
        if health.fake_gpus:
            from nodeagent.gpu.fake import FakeNvml

            return probe(NvmlBackend(FakeNvml(Path(health.fake_gpus))))
        return probe(NvmlBackend(load_pynvml()))
    except GpuUnavailable as exc:
        return GpuSnapshot(available=False, reason=str(exc))


def exit_code(health: HealthConfig, snapshot: GpuSnapshot, decision: GpuDecision) -> int:
    if not snapshot.available:
        return EX_CONFIG if health.gpu == "on" else UNAVAILABLE
    return UNHEALTHY if decision.cordon is not None or decision.unfit is not None else HEALTHY


def _summary(snapshot: GpuSnapshot, decision: GpuDecision, code: int) -> str:
    if code == EX_CONFIG:
        return "health.gpu is 'on' but GPU monitoring is unavailable: `nodeagent run` exits 78"
    if not snapshot.available:
        return "not checked: GPU monitoring unavailable"
    if decision.cordon is not None:
        return f"unhealthy, the agent would cordon and drain it: {decision.cordon.reason}"
    if decision.unfit is not None:
        return f"unhealthy, the agent would not take part: {decision.unfit}"
    return f"healthy: {len(decision.usable or ())} GPUs usable"


def report(
    settings: Settings,
    snapshot: GpuSnapshot,
    verdicts: list[Verdict],
    decision: GpuDecision,
    code: int,
) -> dict[str, Any]:
    """The JSON document: the node, the outcome and, per GPU, its verdict and readings."""
    readings = {r.index: r for r in snapshot.gpus}
    return {
        "node": settings.node,
        "exit_code": code,
        "summary": _summary(snapshot, decision, code),
        "available": snapshot.available,
        "reason": snapshot.reason or None,
        "gpus_needed": settings.gpus_needed,
        "usable": list(decision.usable) if decision.usable is not None else None,
        "cordon": decision.cordon.reason if decision.cordon is not None else None,
        "unfit": decision.unfit,
        "config_error": settings.config_error,
        "gpus": [_gpu(v, readings[v.index]) for v in verdicts],
    }


def _gpu(verdict: Verdict, reading: GpuReading) -> dict[str, Any]:
    values = asdict(reading)
    values["error"] = reading.error.value if reading.error is not None else None
    return {
        "index": verdict.index,
        "uuid": values.pop("uuid") or None,
        "bus_id": values.pop("bus_id") or None,
        "health": verdict.health.value,
        "action": verdict.action.value,
        "reason": verdict.reason,
        "readings": {k: v for k, v in values.items() if k != "index"},
    }


def _print_table(doc: dict[str, Any]) -> None:
    """The GPU lines as `nodeagentctl health` prints them, then this check's outcome."""
    gpus = [{**gpu, "temperature_c": gpu["readings"]["temperature_c"]} for gpu in doc["gpus"]]
    node = {
        "cordon": None,
        "unfit": None,
        "gpu": {"available": doc["available"], "reason": doc["reason"], "gpus": gpus},
    }
    print_health(doc["node"], node, as_json=False)
    print(f"node {doc['node']}: {doc['summary']}")
