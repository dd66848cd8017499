"""Command-line overrides (`--set a.b.c=value`, a served deployment's `overrides`): parsing each
item into a dotted key and a YAML-typed value. Applying them to a config's sections is
`loader.apply_overrides`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import yaml

from libra_core.config.errors import OVERRIDES_SOURCE, ConfigError, short_repr
from libra_core.config.yaml_io import MAX_CONFIG_VALUES, StrictLoader, expanded_size, yaml_error_line


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
        # The same guard as a file's (read_yaml_mapping): aliases in one short value can stand for
        # billions of values, which applying the override would copy out. A served deployment takes
        # its overrides from whoever starts a run.
        total_size += expanded_size(value, {})
        if total_size > MAX_CONFIG_VALUES:
            problems.append(
                f"override {short_repr(item)}: the overrides expand to more than the "
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
        value = yaml.load(text, Loader=StrictLoader)  # StrictLoader is a SafeLoader
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
        for tok in yaml.scan(text, Loader=StrictLoader)
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
