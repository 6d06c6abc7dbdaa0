"""YAML for config files: PyYAML's safe loader, refusing a key given twice.

PyYAML keeps the last of two equal keys silently, so a second `lease_ttl:` further down a long
file would quietly win over the one the operator is looking at.
"""

from __future__ import annotations

import yaml

from nodeagent.errors import ConfigError


def load(text: str) -> object:
    """The document in `text`, None if it is empty.

    Raises:
        yaml.YAMLError: it is not YAML.
        ConfigError: naming the dotted key that a mapping has twice.
    """
    return _StrictLoader.load(text)


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader that checks the composed document before constructing it."""

    @classmethod
    def load(cls, text: str) -> object:
        loader = cls(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _reject_duplicate_keys(node, "", set())
            return loader.construct_document(node)
        finally:
            loader.dispose()


def _reject_duplicate_keys(node: yaml.Node, path: str, seen: set[int]) -> None:
    """Raises ConfigError naming the dotted key that appears twice in one mapping."""
    if id(node) in seen:  # an alias of a node already checked (or of an ancestor)
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _reject_duplicate_keys(item, f"{path}[{i}]", seen)
    if not isinstance(node, yaml.MappingNode):
        return
    keys: set[str] = set()
    for key_node, value_node in node.value:
        name = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
        dotted = f"{path}.{name}" if path else name
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
            if name in keys:
                raise ConfigError(
                    dotted,
                    f"given twice (again on line {key_node.start_mark.line + 1}); keep one",
                )
            keys.add(name)
        _reject_duplicate_keys(value_node, dotted, seen)
