"""Turning `stages.yaml` plus command-line overrides into one validated `LibraConfig`.

This is the edge where raw text becomes typed config: the CLI and the flows call `load_config`
once, and everything downstream receives the frozen result. Every way a config can be wrong (file
missing, YAML syntax, unknown key, bad type, out-of-range value, malformed override) surfaces as a
single `ConfigError` listing *all* problems, one line each, keyed by the dotted path the user
would edit. Loading is pure apart from reading the one file it is given; `write_resolved_config`
is the only function here that writes.
"""

from __future__ import annotations

import difflib
import functools
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from libra_core.config.errors import (
    DEFAULTS_SOURCE,
    OVERRIDES_SOURCE,
    ConfigError,
    short_repr,
)
from libra_core.config.models import LibraConfig
from libra_core.config.overrides import parse_overrides
from libra_core.config.yaml_io import (
    StrictDumper,
    read_yaml_mapping,
)
from libra_core.data.atomic import atomic_path

RESOLVED_CONFIG_NAME = "config.resolved.yaml"
TOP_LEVEL = "(top level)"  # the key path of an error about the whole config


# --------------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------------


def apply_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of `raw` with each dotted key in `overrides` set, creating missing sections.

    The value replaces whatever is at its path (a mapping value replaces the whole section rather
    than merging into it, so `model={type: hf_local, path: ...}` drops the tiny-model keys).
    Setting the `type` of a variant section (`model`, `environment`: a tagged union of models) to
    another variant than the section holds (its default when the file gives none) switches the
    variant: the keys the file gave belonged to the old variant and are dropped, so
    `environment.type=code` works on a file that configures the arithmetic task; keys set by
    earlier overrides stay, nested ones too (validation names them if the new variant has no such
    key). The `type` of any other section (`scheduler.type`) is a plain key. Walking through a
    key that holds a non-mapping is a `ConfigError` naming that key. `raw` is not modified, and
    YAML aliases in it become separate copies (an override of one does not change the other).
    """
    variants = variant_sections()
    merged: dict[str, Any] = _fresh(dict(raw))
    problems: list[str] = []
    done: list[str] = []  # the overrides applied so far

    def set_by_overrides(node: dict[str, Any], section: str) -> dict[str, Any]:
        """What earlier overrides set in `node` (the section at `section`), nested as they set it:
        `environment.reward.correct=2` keeps `{reward: {correct: 2}}`, not the file's `reward`
        (until 2026-12-06 only whole keys were kept, and that override was dropped silently)."""
        kept: dict[str, Any] = {}
        for d in done:
            if not d.startswith(section + "."):
                continue
            rel = d[len(section) + 1 :].split(".")
            src: Any = node
            for part in rel:
                if not isinstance(src, dict) or part not in src:
                    break
                src = src[part]
            else:
                dst = kept
                for part in rel[:-1]:
                    dst = dst.setdefault(part, {})
                dst[rel[-1]] = src
        return kept

    for dotted, value in overrides.items():
        parts = dotted.split(".")
        node = merged
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                blocked = ".".join(parts[: depth + 1])
                problems.append(
                    f"{dotted}: cannot set, {blocked} holds {short_repr(child)} "
                    f"({type(child).__name__}), not a mapping"
                )
                break
            node = child
        else:
            section = ".".join(parts[:-1])
            if parts[-1] == "type" and section in variants and node.get("type", variants[section]) != value:
                kept = set_by_overrides(node, section)
                node.clear()  # a different variant: the old variant's keys do not apply
                node.update(kept)
            node[parts[-1]] = _fresh(value)
            done.append(dotted)
    if problems:
        raise ConfigError(problems, OVERRIDES_SOURCE)
    return merged


def _fresh(value: Any) -> Any:
    """A deep copy that shares nothing: `copy.deepcopy` keeps two YAML aliases of one mapping one
    object, so setting a key under one would set it under the other."""
    if isinstance(value, dict):
        return {k: _fresh(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fresh(v) for v in value]
    return value  # a YAML scalar: immutable


@functools.cache
def variant_sections() -> dict[str, str | None]:
    """Dotted path -> default `type` of every config section that is a tagged union of variants."""
    out: dict[str, str | None] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            tp = _strip_annotated(field.annotation)
            arms = _union_arms(tp)
            if arms and _variant_tags(arms):
                default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
                out[prefix + name] = getattr(default, "type", None)
            elif _is_model(tp):
                walk(tp, f"{prefix}{name}.")

    walk(LibraConfig, "")
    return out


# --------------------------------------------------------------------------------------------
# Validation errors -> one line per problem
# --------------------------------------------------------------------------------------------


def _strip_annotated(tp: Any) -> Any:
    while get_origin(tp) is typing.Annotated:
        tp = get_args(tp)[0]
    return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _union_arms(tp: Any) -> tuple[Any, ...]:
    if get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(_strip_annotated(arm) for arm in get_args(tp))
    return ()


def _variant_tags(arms: Sequence[Any]) -> dict[str, type[BaseModel]]:
    """Map each `type:` tag of a discriminated union to its model class."""
    tags: dict[str, type[BaseModel]] = {}
    for arm in arms:
        if _is_model(arm) and "type" in arm.model_fields:
            tag_type = _strip_annotated(arm.model_fields["type"].annotation)
            if get_origin(tag_type) is Literal:
                for tag in get_args(tag_type):
                    tags[str(tag)] = arm
    return tags


def _walk_loc(loc: Sequence[int | str]) -> tuple[str, Any]:
    """Dotted path as the user writes it, and the type found at the end of `loc`.

    The type walk follows `LibraConfig` field annotations; a discriminated-union tag in `loc`
    (pydantic inserts e.g. `tiny_qwen2` after `model`) selects the variant and is left out of the
    path, because the user never writes it as a key. The type is None once the walk leaves the
    model tree (e.g. below an unknown key).
    """
    path = ""
    tp: Any = LibraConfig
    for part in loc:
        tp = _strip_annotated(tp)
        arms = _union_arms(tp)
        if arms and isinstance(part, str):
            variant = _variant_tags(arms).get(part)
            if variant is not None:
                tp = variant
                continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        if _is_model(tp) and isinstance(part, str) and part in tp.model_fields:
            tp = tp.model_fields[part].annotation
        elif isinstance(part, int) and get_origin(tp) in (tuple, list):
            args = get_args(tp)
            if get_origin(tp) is list or (len(args) == 2 and args[1] is Ellipsis):
                tp = args[0]  # list[X] / tuple[X, ...]
            else:
                tp = args[part] if part < len(args) else None  # fixed-length tuple[A, B]
        else:
            tp = None
    return path or TOP_LEVEL, _strip_annotated(tp) if tp is not None else None


def _error_line(error: ErrorDetails) -> tuple[str, str]:
    """`(key path, problem text)` for one pydantic error dict."""
    kind: str = error["type"]
    loc: tuple[int | str, ...] = tuple(error["loc"])
    msg: str = error["msg"]
    value = error.get("input")
    ctx: dict[str, Any] = dict(error.get("ctx") or {})

    if kind == "extra_forbidden":
        path, _ = _walk_loc(loc)
        _, parent = _walk_loc(loc[:-1])
        if not _is_model(parent):
            return path, "unknown key"
        allowed = list(parent.model_fields)
        text = f"unknown key; allowed keys: {', '.join(allowed)}"
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        return path, text + (f"; did you mean {close[0]!r}?" if close else "")

    path, tp = _walk_loc(loc)
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tags = ", ".join(repr(tag) for tag in _variant_tags(_union_arms(tp)))
        discriminator = str(ctx.get("discriminator", "type")).strip("'")
        if kind == "union_tag_invalid":
            return f"{path}.{discriminator}", f"unknown variant {ctx.get('tag')!r}; allowed: {tags}"
        return f"{path}.{discriminator}", f"required key is missing; allowed: {tags}"
    if kind == "missing":
        return path, "required key is missing"
    if kind == "value_error":
        # model validators (cross-field checks): the message already names the fields and values
        return path, msg.removeprefix("Value error, ")
    if kind == "string_type" and isinstance(value, dict | list | int | float | bool):
        # `--set experiment.name=007` (7) or `output_dir=/data/run: 2` (a mapping): the value was
        # not shown for a mapping, and nothing said how to keep it text (until 2026-12-07)
        read_as = type(value).__name__
        return path, f"{msg}; got {short_repr(value)} (YAML read it as {read_as}: quote it to keep it text)"
    if isinstance(value, dict):
        return path, msg
    return path, f"{msg}; got {short_repr(value)}"


def _override_touches(path: str, override_keys: Sequence[str]) -> bool:
    """True when an override set this path, a section containing it, or a key below it."""
    return any(
        path == key or path.startswith((key + ".", key + "[")) or key.startswith(path + ".")
        for key in override_keys
    )


def _validation_problems(exc: ValidationError, override_keys: Sequence[str]) -> list[str]:
    problems = []
    for error in exc.errors(include_url=False):
        path, text = _error_line(error)
        if path == TOP_LEVEL and error["type"] == "value_error":
            # LibraConfig's cross-field checks (config/cross_field.py): one problem per line, each
            # starting with the keys it is about, so neither "(top level)" nor a blame by path
            for line in text.splitlines():
                suffix = " (from an override)" if _names_an_overridden_key(line, override_keys) else ""
                problems.append(f"{line}{suffix}")
            continue
        suffix = " (from an override)" if _override_touches(path, override_keys) else ""
        problems.append(f"{path}: {text}{suffix}")
    return problems


def _names_an_overridden_key(text: str, override_keys: Sequence[str]) -> bool:
    """True when `text` names a key path an override set, or one inside a section it set."""
    return any(re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", text) for key in override_keys)


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> LibraConfig:
    """Read `path` (YAML), apply `key.path=value` overrides, and validate into a `LibraConfig`.

    `path=None` starts from the model defaults. Raises `ConfigError` listing every problem; its
    `source` is the file path, or `<overrides>`/`<defaults>` when no file was given.
    """
    parsed = parse_overrides(overrides)
    if path is None:
        source = OVERRIDES_SOURCE if overrides else DEFAULTS_SOURCE
        raw: dict[str, Any] = {}
    else:
        source = str(path)
        raw = _empty_sections_as_defaults(read_yaml_mapping(Path(path)), LibraConfig)
    raw = apply_overrides(raw, parsed)
    try:
        return LibraConfig.model_validate(raw)
    except ValidationError as exc:
        # with a file, say which problems came from the command line rather than the file
        blamed_on_overrides = list(parsed) if path is not None else []
        raise ConfigError(_validation_problems(exc, blamed_on_overrides), source) from None


def _empty_sections_as_defaults(data: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """`data` with each section left empty (`eval:` with every key commented out: YAML's null) read
    as `{}`, all defaults, as an empty file is. "Delete a key to fall back to its default" (the
    header of stages.yaml) made `eval:` an error that, with a `--set eval.every=2`, was blamed on the
    override (until 2026-12-07). Only sections typed as one model; a field that takes null keeps it."""
    out = dict(data)
    for key, value in data.items():
        field = model.model_fields.get(key)
        section = field.annotation if field is not None else None
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            continue
        if value is None:
            out[key] = {}
        elif isinstance(value, dict):
            out[key] = _empty_sections_as_defaults(value, section)
    return out


def config_to_yaml(cfg: LibraConfig) -> str:
    """Every field of `cfg` (defaults included) as YAML; `load_config` on it gives back `cfg`."""
    data = cfg.model_dump(mode="json")
    body = yaml.dump(
        data, Dumper=StrictDumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=110
    )
    return "# Resolved Libra config: stages.yaml + overrides + defaults. Generated; do not edit.\n" + body


def write_resolved_config(cfg: LibraConfig, run_dir: str | Path) -> Path:
    """Write `run_dir/config.resolved.yaml` atomically, so a crash never leaves half a file.

    Called once per run by whoever creates the run folder; creates `run_dir` if needed and
    returns the written path.
    """
    target = Path(run_dir) / RESOLVED_CONFIG_NAME
    with atomic_path(target) as tmp:  # the folder is made, the file and the rename synced
        tmp.write_text(config_to_yaml(cfg), encoding="utf-8")
    return target
