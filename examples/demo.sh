#!/usr/bin/env bash
# nodeagent demo on a fresh Debian machine: installs redis-server, a venv with nodeagent and the
# CPU build of torch, then runs examples/demo.py (local Redis, 3 agents, DDP training, faults).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup
echo "== demo"
exec .venv/bin/python examples/demo.py "$@"
