"""What the frameworks people train with need to get nodeagent's memory tier, beats and compute
marks without a script written against `nodeagent.worker` (docs/frameworks.md).

Each module imports its framework (and torch) when it is imported, and only a training script
imports it: the agent never does, and none of the frameworks is a dependency of nodeagent.

- `nodeagent.integrations.lightning`: `NodeagentCallback` for a `lightning.Trainer`;
- `nodeagent.integrations.transformers`: `NodeagentCallback` for a `transformers.Trainer`.
"""
