"""YAML as this project reads it: duplicate keys refused, numbers and booleans as YAML 1.2 reads
them, and a config file's aliases bounded. Used for config files and overrides (loader.py,
overrides.py) and for spec files (planner/spec_files.py).
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from libra_core.config.errors import ConfigError


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, reads `1e-4` as a float and integers, booleans,
    floats and dates as YAML 1.2 does.

    PyYAML implements YAML 1.1, where `1e-4` (no dot) is a string, `1:30.5` is 90.5 (base 60),
    `2024-01-01` is a date and a repeated key silently keeps the last value; each turns a
    plausible config into a surprising one.
    """


_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")

# Integers, booleans and floats as YAML 1.2 reads them: YAML 1.1 reads `010` as 8 (octal), `1:30`
# as 90 and `1:30.5` as 90.5 (base 60), `yes`/`on` as true and `2024-01-01` as a date (no config
# field is one), none of which a config means. YAML 1.2 has no implicit timestamps: such text is a
# string (`experiment.name=2024-01-01`).
_INT, _BOOL, _MERGE = "tag:yaml.org,2002:int", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:merge"
_FLOAT, _TIMESTAMP = "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp"
_BOOL_12 = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT_12 = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
# PyYAML's float pattern less its base-60 branch (`[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*`)
_FLOAT_NO_BASE60 = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _BOOL, _FLOAT, _TIMESTAMP)]
    for first, resolvers in StrictLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_implicit_resolver(_BOOL, _BOOL_12, list("tTfF"))
StrictLoader.add_implicit_resolver(_INT, _INT_12, list("-+0123456789"))
StrictLoader.add_implicit_resolver(_FLOAT, _FLOAT_NO_BASE60, list("-+0123456789."))
StrictLoader.add_implicit_resolver(_FLOAT, _EXPONENT_FLOAT, list("-+0123456789."))


def _construct_int(loader: StrictLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    try:
        if text.startswith(("0o", "0x")):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text, 10)  # `010` is ten
    except ValueError as err:  # past Python's 4300-digit limit: was a raw ValueError traceback
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer of {len(text):,} characters is too long to read ({err})", node.start_mark
        ) from None


StrictLoader.add_constructor(_INT, _construct_int)


class StrictDumper(yaml.SafeDumper):
    """Quotes every string the strict loader would read as another type: the stock dumper leaves
    `2e4` plain (a string in YAML 1.1), which `StrictLoader` reads back as a float."""


def _represent_str(dumper: StrictDumper, value: str) -> yaml.ScalarNode:
    # NEL (U+0085) is a line break to YAML: written raw in a quoted scalar, it reads back folded
    # to a space (a path `qwen\x85v2` came back `qwen v2` until 2026-12-06); double quotes escape it.
    style = '"' if "\x85" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


StrictDumper.add_representer(str, _represent_str)
StrictDumper.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))
StrictDumper.add_implicit_resolver(_BOOL, _BOOL_12, list("tTfF"))
StrictDumper.add_implicit_resolver(_INT, _INT_12, list("-+0123456789"))


def _construct_mapping_no_duplicates(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    # Duplicates among the mapping's own keys; keys brought in by a merge (`<<: *base`) may be
    # overridden, which is what a merge is for.
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE:
            continue
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            break  # construct_mapping below reports the unhashable key with its position
        if key in seen:
            first = seen[key].start_mark
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first defined on line {first.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node
    loader.flatten_mapping(node)
    return loader.construct_mapping(node, deep=True)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping_no_duplicates)


def strict_yaml_load(text: str) -> Any:
    """YAML as this project reads it everywhere: duplicate keys rejected, `1e-4` a float. Raises
    `yaml.YAMLError`; `yaml_error_line` turns it into one line for a message."""
    return yaml.load(text, Loader=StrictLoader)  # StrictLoader is a SafeLoader


def yaml_error_line(exc: yaml.YAMLError) -> str:
    """`line L, column C: problem` from a PyYAML error (1-based, as editors show them)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = f"{context}; {problem}" if context else problem
    if mark is None:
        return f"invalid YAML: {text}"
    return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {text}"


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"config file not found: {path}; pass an existing YAML file"], source) from None
    except IsADirectoryError:
        raise ConfigError([f"config path is a directory, not a file: {path}"], source) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"config file is not valid UTF-8 text: {exc}"], source) from None
    except OSError as exc:
        raise ConfigError([f"cannot read config file: {exc.strerror or exc}"], source) from None
    try:
        raw = yaml.load(text, Loader=StrictLoader)  # StrictLoader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError([yaml_error_line(exc)], source) from None
    if raw is None:  # an empty (or all-comment) file means "all defaults"
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(
            [f"top level must be a mapping of sections (experiment:, model:, ...), got {type(raw).__name__}"],
            source,
        )
    size = expanded_size(raw, {})
    if size > MAX_CONFIG_VALUES:
        # YAML aliases let a few lines stand for billions of values ("billion laughs"); copying
        # and validating them would take tens of seconds and gigabytes before any error.
        limit = f"more than the {MAX_CONFIG_VALUES:,} allowed"
        raise ConfigError([f"config expands to {size:,} values (YAML aliases?), {limit}"], source)
    return raw


MAX_CONFIG_VALUES = 100_000  # stages.yaml has about 200


def expanded_size(value: Any, memo: dict[int, int]) -> int:
    """Values in `value` with every YAML alias expanded, counted without expanding them (each
    shared mapping or list is counted once and its size reused)."""
    if not isinstance(value, dict | list):
        return 1
    known = memo.get(id(value))
    if known is None:
        items = value.values() if isinstance(value, dict) else value
        known = memo[id(value)] = 1 + sum(expanded_size(v, memo) for v in items)
    return known
