"""Turning `stages.yaml` plus command-line overrides into one validated `LibraConfig`.

This is the edge where raw text becomes typed config: the CLI and the flows call `load_config`
once, and everything downstream receives the frozen result. Every way a config can be wrong (file
missing, YAML syntax, unknown key, bad type, out-of-range value, malformed override) surfaces as a
single `ConfigError` listing *all* problems, one line each, keyed by the dotted path the user
would edit. Loading is pure apart from reading the one file it is given; `write_resolved_config`
is the only function here that writes.
"""

from __future__ import annotations

import bisect
import difflib
import functools
import os
import re
import tempfile
import types
import typing
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from libra_core.config.models import LibraConfig

OVERRIDES_SOURCE = "<overrides>"
DEFAULTS_SOURCE = "<defaults>"
RESOLVED_CONFIG_NAME = "config.resolved.yaml"

_MAX_VALUE_REPR = 80


class ConfigError(Exception):
    """A user-facing config problem: what is wrong, where, and what is allowed.

    `problems` holds one human-readable line per problem (`stages.rollout.size: ...`); `source` is
    the file the config came from, or `<overrides>` / `<defaults>` when no file is involved.
    """

    def __init__(self, problems: Sequence[str], source: str) -> None:
        assert problems, "ConfigError needs at least one problem"
        self.problems: list[str] = list(problems)
        self.source: str = source
        super().__init__(format_problems(self))

    def __reduce__(self) -> tuple[Any, tuple[list[str], str]]:
        # Prefect and multiprocessing pickle exceptions; the default would call __init__(message).
        return (type(self), (self.problems, self.source))


def format_problems(err: ConfigError) -> str:
    """One line per problem, each prefixed by the source, for the CLI to print as-is."""
    return "\n".join(f"{err.source}: {problem}" for problem in err.problems)


# --------------------------------------------------------------------------------------------
# YAML reading
# --------------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
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
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _BOOL, _FLOAT, _TIMESTAMP)]
    for first, resolvers in _StrictLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(_BOOL, _BOOL_12, list("tTfF"))
_StrictLoader.add_implicit_resolver(_INT, _INT_12, list("-+0123456789"))
_StrictLoader.add_implicit_resolver(_FLOAT, _FLOAT_NO_BASE60, list("-+0123456789."))
_StrictLoader.add_implicit_resolver(_FLOAT, _EXPONENT_FLOAT, list("-+0123456789."))


def _construct_int(loader: _StrictLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)  # `010` is ten


_StrictLoader.add_constructor(_INT, _construct_int)


class _Dumper(yaml.SafeDumper):
    """Quotes every string the strict loader would read as another type: the stock dumper leaves
    `2e4` plain (a string in YAML 1.1), which `_StrictLoader` reads back as a float."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))
_Dumper.add_implicit_resolver(_BOOL, _BOOL_12, list("tTfF"))
_Dumper.add_implicit_resolver(_INT, _INT_12, list("-+0123456789"))


def _construct_mapping_no_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
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


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping_no_duplicates
)


def strict_yaml_load(text: str) -> Any:
    """YAML as this project reads it everywhere: duplicate keys rejected, `1e-4` a float. Raises
    `yaml.YAMLError`; `yaml_error_line` turns it into one line for a message."""
    return yaml.load(text, Loader=_StrictLoader)  # _StrictLoader is a SafeLoader


def yaml_error_line(exc: yaml.YAMLError) -> str:
    """`line L, column C: problem` from a PyYAML error (1-based, as editors show them)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = f"{context}; {problem}" if context else problem
    if mark is None:
        return f"invalid YAML: {text}"
    return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {text}"


def _read_yaml_mapping(path: Path) -> dict[str, Any]:
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
        raw = yaml.load(text, Loader=_StrictLoader)  # _StrictLoader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError([yaml_error_line(exc)], source) from None
    if raw is None:  # an empty (or all-comment) file means "all defaults"
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(
            [f"top level must be a mapping of sections (experiment:, model:, ...), got {type(raw).__name__}"],
            source,
        )
    size = _expanded_size(raw, {})
    if size > MAX_CONFIG_VALUES:
        # YAML aliases let a few lines stand for billions of values ("billion laughs"); copying
        # and validating them would take tens of seconds and gigabytes before any error.
        limit = f"more than the {MAX_CONFIG_VALUES:,} allowed"
        raise ConfigError([f"config expands to {size:,} values (YAML aliases?), {limit}"], source)
    return raw


MAX_CONFIG_VALUES = 100_000  # stages.yaml has about 200


def _expanded_size(value: Any, memo: dict[int, int]) -> int:
    """Values in `value` with every YAML alias expanded, counted without expanding them (each
    shared mapping or list is counted once and its size reused)."""
    if not isinstance(value, dict | list):
        return 1
    known = memo.get(id(value))
    if known is None:
        items = value.values() if isinstance(value, dict) else value
        known = memo[id(value)] = 1 + sum(_expanded_size(v, memo) for v in items)
    return known


# --------------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------------


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Parse `a.b.c=value` items into `{"a.b.c": value}`, values typed by YAML.

    `3` becomes an int, `1e-4` a float, `true` a bool, `null` (or nothing) None, `[1, 2]` a list,
    `{type: hf_local, ...}` a mapping; anything else stays a string. A plain value (one that does
    not start with `[`, `{`, `"` or `'`) that YAML cannot read, or in which YAML would read ` #` as
    the start of a comment, is kept as the text given: `schedule.cron=*/5 * * * *` (`*` starts a
    YAML alias) and `experiment.output_dir=/data/run #2` (a comment would cut it to `/data/run`)
    mean what they say. A value starting with one of those four characters is YAML, so a broken
    one is an error, as is a comment after it. A later item for the same key wins. All malformed
    items are reported together in one `ConfigError` with source `<overrides>`.
    """
    if isinstance(items, str):  # a lone "a=1" would otherwise be read character by character
        raise TypeError(f"overrides must be a list of 'key.path=value' strings, got the string {items!r}")
    parsed: dict[str, Any] = {}
    problems: list[str] = []
    total_size = 0
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            problems.append(f"override {item!r} has no '='; write it as key.path=value")
            continue
        if not key or any(not part for part in key.split(".")):
            problems.append(f"override {item!r} has an empty key path; write it as key.path=value")
            continue
        try:
            value = _override_value(text)
        except yaml.YAMLError as exc:
            problems.append(
                f"override {item!r}: value is not valid YAML ({yaml_error_line(exc)}); {_QUOTE_HINT}"
            )
            continue
        except _CommentInValue as exc:
            problems.append(f"override {item!r}: {exc}")
            continue
        # The same guard as a file's (_read_yaml_mapping): aliases in one short value can stand for
        # billions of values, which applying the override would copy out. A served deployment takes
        # its overrides from whoever starts a run.
        total_size += _expanded_size(value, {})
        if total_size > MAX_CONFIG_VALUES:
            problems.append(
                f"override {_short_repr(item)}: the overrides expand to more than the "
                f"{MAX_CONFIG_VALUES:,} values allowed (YAML aliases?)"
            )
            break
        parsed.pop(key, None)  # a repeated key moves to its last place: applied in order, it wins
        parsed[key] = value
    if problems:
        raise ConfigError(problems, OVERRIDES_SOURCE)
    return parsed


_QUOTE_HINT = "to pass the value as text, quote it (key='\"...\"' in a shell)"
_YAML_VALUE_START = ("[", "{", '"', "'")  # a value starting with one of these is always read as YAML


class _CommentInValue(ValueError):
    """A YAML value with ` #` after it, which YAML would drop as a comment."""


def _override_value(text: str) -> Any:
    """The value of one override's text (after the `=`), as `parse_overrides` describes. Raises
    `yaml.YAMLError` or `_CommentInValue` for a YAML value (starting with `[`, `{`, `"`, `'`)
    that is broken or followed by a comment."""
    plain = not text.strip().startswith(_YAML_VALUE_START)
    try:
        value = yaml.load(text, Loader=_StrictLoader)  # _StrictLoader is a SafeLoader
        comment = _comment_start(text)
    except yaml.YAMLError:
        if plain:
            return text.strip()
        raise
    if comment is None:
        return value
    if plain:
        return text.strip()
    raise _CommentInValue(
        f"YAML reads {text[comment:].strip()!r} as a comment and would drop it; put it inside the "
        "quotes, or leave it out"
    )


def _comment_start(text: str) -> int | None:
    """Where the first YAML comment in `text` starts (None: it has none): a `#` at the start or
    after a blank that is inside no scalar (in a quoted or plain scalar it is text: `"a #b"`)."""
    hashes = [i for i, char in enumerate(text) if char == "#" and (i == 0 or text[i - 1] in " \t\r\n")]
    if not hashes:
        return None
    scalars = [
        (tok.start_mark.index, tok.end_mark.index)
        for tok in yaml.scan(text, Loader=_StrictLoader)
        if isinstance(tok, yaml.ScalarToken)
    ]  # in text order, never overlapping
    starts = [start for start, _ in scalars]
    for i in hashes:
        at = bisect.bisect_right(starts, i) - 1
        if at < 0 or i >= scalars[at][1]:
            return i
    return None


def yaml_quoted(text: str) -> str:
    """`text` as a YAML double-quoted scalar that reads back as exactly `text`, for an override
    built from any string, such as a path (`experiment.output_dir=` + this): left plain, ` #` in it
    would start a comment and `: ` a mapping. Everything but printable ASCII is escaped (`\\U`
    with 8 digits: JSON's `\\u` pairs for a character beyond U+FFFF read back as two halves)."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif " " <= char <= "~":
            out.append(char)
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


def apply_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of `raw` with each dotted key in `overrides` set, creating missing sections.

    The value replaces whatever is at its path (a mapping value replaces the whole section rather
    than merging into it, so `model={type: hf_local, path: ...}` drops the tiny-model keys).
    Setting the `type` of a variant section (`model`, `environment`: a tagged union of models) to
    another variant than the section holds (its default when the file gives none) switches the
    variant: the keys the file gave belonged to the old variant and are dropped, so
    `environment.type=code` works on a file that configures the arithmetic task; keys set by
    earlier overrides stay (validation names them if the new variant has no such key). The `type`
    of any other section (`scheduler.type`) is a plain key. Walking through a key that holds a
    non-mapping is a `ConfigError` naming that key. `raw` is not modified, and YAML aliases in it
    become separate copies (an override of one does not change the other).
    """
    variants = variant_sections()
    merged: dict[str, Any] = _fresh(dict(raw))
    problems: list[str] = []
    done: list[str] = []  # the overrides applied so far

    def from_override(path: str) -> bool:
        return any(path == d or path.startswith(d + ".") for d in done)

    for dotted, value in overrides.items():
        parts = dotted.split(".")
        node = merged
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                blocked = ".".join(parts[: depth + 1])
                problems.append(
                    f"{dotted}: cannot set, {blocked} holds {_short_repr(child)} "
                    f"({type(child).__name__}), not a mapping"
                )
                break
            node = child
        else:
            section = ".".join(parts[:-1])
            if parts[-1] == "type" and section in variants and node.get("type", variants[section]) != value:
                kept = {k: v for k, v in node.items() if from_override(f"{section}.{k}")}
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


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_VALUE_REPR else text[: _MAX_VALUE_REPR - 3] + "..."


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
    return path or "(top level)", _strip_annotated(tp) if tp is not None else None


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
    if isinstance(value, dict):
        return path, msg
    return path, f"{msg}; got {_short_repr(value)}"


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
        suffix = " (from an override)" if _override_touches(path, override_keys) else ""
        problems.append(f"{path}: {text}{suffix}")
    return problems


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
        raw = _read_yaml_mapping(Path(path))
    raw = apply_overrides(raw, parsed)
    try:
        return LibraConfig.model_validate(raw)
    except ValidationError as exc:
        # with a file, say which problems came from the command line rather than the file
        blamed_on_overrides = list(parsed) if path is not None else []
        raise ConfigError(_validation_problems(exc, blamed_on_overrides), source) from None


def config_to_yaml(cfg: LibraConfig) -> str:
    """Every field of `cfg` (defaults included) as YAML; `load_config` on it gives back `cfg`."""
    data = cfg.model_dump(mode="json")
    body = yaml.dump(
        data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=110
    )
    return "# Resolved Libra config: stages.yaml + overrides + defaults. Generated; do not edit.\n" + body


def write_resolved_config(cfg: LibraConfig, run_dir: str | Path) -> Path:
    """Write `run_dir/config.resolved.yaml` atomically, so a crash never leaves half a file.

    Called once per run by whoever creates the run folder; creates `run_dir` if needed and
    returns the written path.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / RESOLVED_CONFIG_NAME
    fd, tmp_name = tempfile.mkstemp(prefix=f".{RESOLVED_CONFIG_NAME}.", suffix=".tmp", dir=run_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(config_to_yaml(cfg))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; the resolved config is for everyone to read
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return target
