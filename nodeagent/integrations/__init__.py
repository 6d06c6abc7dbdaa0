"""What the frameworks people train with need to get nodeagent's memory tier, beats and compute
marks without a script written against `nodeagent.worker` (docs/frameworks.md).

Each module imports its framework (and torch) when it is imported, and only a training script
imports it: the agent never does, and none of the frameworks is a dependency of nodeagent.

- lightning.py: `NodeagentCallback` for a `lightning.Trainer`;
- transformers.py: `NodeagentCallback` for a `transformers.Trainer`;
- torchtitan.py: `NodeagentCheckpointManager`, torchtitan's checkpoint manager on the tiers.
"""
