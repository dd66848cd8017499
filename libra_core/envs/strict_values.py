"""Inside half of the code reward's test program: the values a test may compare.

`libra_core/envs/code_harness.py` rewrites every `assert` of a problem's tests so that each operand
of a comparison, of arithmetic, of `not`/`and`/`or`, each argument of a value builtin (`abs`, `len`,
`set`, `sorted`, ...) and the asserted expression itself pass through `strict` before they are used.
`strict` lets through only values whose equality, ordering and arithmetic are Python's own:
exact built-in scalars (int, float, complex, bool, str, bytes, None, range, classes) and exact
built-in containers (list, tuple, set, frozenset, dict, deque, OrderedDict, defaultdict, Counter,
dict views) of such values, checked recursively. So an answer whose function returns an object
with `__eq__` always True, or a `__sub__` that makes `abs(f(x) - y) < 1e-6` hold, fails the test
instead of passing it; float tolerances written in the tests keep their meaning. A built-in iterator
(a generator, `map`, `zip`, ...) comes back wrapped, checking each item as it is drawn.

This file is executed as source inside the sandbox (stdlib only, no libra_core imports), in a
namespace whose builtins were copied before the answer ran, so it runs with the original `type`,
`id`, `isinstance` even if the answer rebinds them in the `builtins` module.
"""

import collections
import itertools


def _generator():
    yield None


# Keyed by id: `type(v) in {int, ...}` would hash and compare `type(v)` itself, which a metaclass with
# `__eq__`/`__hash__` could make equal to `int`. These classes live as long as the process.
_SCALAR_TYPES: tuple[type, ...] = (
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    bytearray,
    type(None),
    type(...),
    range,
    type,
)
_SCALARS = {id(t) for t in _SCALAR_TYPES}
_SEQUENCE_TYPES: tuple[type, ...] = (
    list,
    tuple,
    set,
    frozenset,
    collections.deque,
    type({}.keys()),
    type({}.values()),
    type({}.items()),
)
_SEQUENCES = {id(t) for t in _SEQUENCE_TYPES}
_MAPPING_TYPES: tuple[type, ...] = (
    dict,
    collections.OrderedDict,
    collections.defaultdict,
    collections.Counter,
)
_MAPPINGS = {id(t) for t in _MAPPING_TYPES}
_ITERATOR_TYPES = [
    type(_generator()),
    map,
    filter,
    zip,
    enumerate,
    reversed,
    type(iter([])),
    type(reversed([])),
    type(iter(())),
    type(iter(set())),
    type(iter("")),
    type(iter(b"")),
    type(iter(range(0))),
    type(iter({})),
    type(iter({}.values())),
    type(iter({}.items())),
    type(iter(collections.deque())),
]
_ITERATOR_TYPES += [v for v in vars(itertools).values() if isinstance(v, type)]
_ITERATORS = {id(t) for t in _ITERATOR_TYPES}
# Counter is a Python class: an answer could patch its methods. Its attributes as they were before the
# answer ran; a Counter is compared only while they are unchanged. The class itself is captured here
# too: an answer that patched Counter and then rebound `collections.Counter = dict` had its original
# Counters skip this check and compare always-equal (every MBPP problem scored 1.0, until 2026-12-07).
_COUNTER = collections.Counter
_COUNTER_ATTRS = dict(vars(_COUNTER))
_dict_keys, _dict_values = dict.keys, dict.values


def _counter_intact():
    now = vars(_COUNTER)
    return len(now) == len(_COUNTER_ATTRS) and all(
        k in now and now[k] is v for k, v in _COUNTER_ATTRS.items()
    )


def _refuse(value):
    return AssertionError(
        f"the tests compare a {type(value).__module__}.{type(value).__qualname__}; only built-in "
        "values (numbers, str, bytes, None, and lists/tuples/sets/dicts of them) are compared"
    )


def _checked_items(iterator):
    for item in iterator:
        yield strict(item)


def strict(value):
    """`value` itself if it is a built-in value (recursively), a checking wrapper for a built-in
    iterator; raises AssertionError for anything else."""
    if id(type(value)) in _ITERATORS:
        return _checked_items(value)
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        kind = id(type(item))
        if kind in _SCALARS or kind in _ITERATORS:  # an iterator inside a container compares by identity
            continue
        if id(item) in seen:
            continue
        if kind in _MAPPINGS:
            if kind == id(_COUNTER) and not _counter_intact():
                raise _refuse(item)
            seen.add(id(item))
            stack.extend(_dict_keys(item))
            stack.extend(_dict_values(item))
        elif kind in _SEQUENCES:
            seen.add(id(item))
            stack.extend(item)
        else:
            raise _refuse(item)
    return value
