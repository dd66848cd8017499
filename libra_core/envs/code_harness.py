"""The program the code reward runs in the sandbox: an answer checked by a problem's tests.

Called by `CodeEnv.run_tests` once per scored answer. Pasting the tests after the answer (one
module) let an answer pass tests it does not solve: a function returning an object whose `__eq__`
is always True satisfies every `assert f(x) == y`, and an answer that defines `set` or `sorted`
changes what `assert set(f(x)) == set(y)` means. So the program here keeps them apart:

- the answer runs in its own namespace; the tests run in another, with a copy of the builtins made
  before the answer ran, holding only the names the tests take from the answer (`names`: the
  function under test, and for MBPP whatever else the reference solution defines that the tests
  use), the trusted `setup` code (HumanEval's prompt: helpers such as `poly` the tests call), and
  fresh copies of the standard modules the tests use without importing (`sys` in MBPP 596);
- every `assert` of the tests is rewritten on the syntax tree so that comparison, arithmetic and
  boolean operands, the arguments of value builtins (`abs`, `len`, `set`, ...) and the asserted
  value pass through `strict_values.strict`, which accepts only built-in values (recursively);
- a fresh random marker printed after the tests must reach stdout (so exiting early does not pass).

Not covered (a deliberate attack on the harness rather than a shortcut): an answer that walks the
interpreter stack into the harness, reads its source for the marker, or patches a module the tests
import themselves (`import math` inside HumanEval/32's check) or a standard class.
"""

from __future__ import annotations

import ast
import builtins
import json
import sys
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

STRICT = "_libra_strict"
_CHECKER_SOURCE = Path(__file__).with_name("strict_values.py").read_text(encoding="utf-8")
# Builtins whose result is computed from their arguments' own methods (`abs` calls `__abs__`, `set`
# iterates and hashes): their positional arguments are checked too. Not `map`/`filter`/`isinstance`:
# those take functions and classes.
VALUE_BUILTINS = frozenset(
    {
        "abs",
        "all",
        "any",
        "bin",
        "bool",
        "chr",
        "complex",
        "dict",
        "divmod",
        "float",
        "format",
        "frozenset",
        "hash",
        "hex",
        "int",
        "len",
        "list",
        "max",
        "min",
        "oct",
        "ord",
        "pow",
        "repr",
        "reversed",
        "round",
        "set",
        "sorted",
        "str",
        "sum",
        "tuple",
    }
)
_BUILTIN_NAMES = frozenset(dir(builtins))


@dataclass(frozen=True)
class CheckPlan:
    """How one problem's tests run against an answer. `tests` is the rewritten test source."""

    tests: str
    names: tuple[str, ...]  # taken from the answer's namespace into the tests'
    modules: tuple[str, ...]  # standard modules the tests use without importing them
    setup: str  # trusted code run in the tests' namespace before them


def _wrap(node: ast.expr) -> ast.expr:
    if isinstance(node, ast.Starred):
        node.value = _wrap(node.value)
        return node
    return ast.Call(func=ast.Name(STRICT, ast.Load()), args=[node], keywords=[])


class _StrictOperands(ast.NodeTransformer):
    """Inside one assert: route every operand whose methods decide the outcome through `strict`."""

    def visit_Compare(self, node: ast.Compare) -> ast.expr:  # noqa: N802 - NodeTransformer's name
        self.generic_visit(node)
        node.left = _wrap(node.left)
        node.comparators = [_wrap(c) for c in node.comparators]
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:  # noqa: N802
        self.generic_visit(node)
        node.left, node.right = _wrap(node.left), _wrap(node.right)
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:  # noqa: N802
        self.generic_visit(node)
        node.operand = _wrap(node.operand)
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:  # noqa: N802
        self.generic_visit(node)
        node.values = [_wrap(v) for v in node.values]
        return node

    def visit_Call(self, node: ast.Call) -> ast.expr:  # noqa: N802
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in VALUE_BUILTINS:
            node.args = [_wrap(a) for a in node.args]
        return node


class _StrictAsserts(ast.NodeTransformer):
    def visit_Assert(self, node: ast.Assert) -> ast.Assert:  # noqa: N802
        node.test = _wrap(_StrictOperands().visit(node.test))
        return node


def strict_tests(tests: str) -> str:
    """`tests` with every assert's operands checked by `strict`; unchanged if it does not parse
    (the program then fails to compile, as it would have)."""
    try:
        tree = ast.parse(tests)
    except (SyntaxError, ValueError):
        return tests
    tree = ast.fix_missing_locations(_StrictAsserts().visit(tree))
    return ast.unparse(tree)


def bound_names(tree: ast.AST) -> set[str]:
    """Every name `tree` binds anywhere: targets, imports, defs, classes, arguments, handlers."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def free_names(code: str) -> set[str]:
    """Names `code` reads but never binds (empty if it does not parse)."""
    try:
        tree = ast.parse(code)
        loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        return loaded - bound_names(tree)
    except (SyntaxError, ValueError):
        return set()


def answer_names(tests: str, solution: str) -> tuple[str, ...]:
    """The names the tests take from an answer: those they use that the reference `solution`
    defines at top level other than by importing (MBPP 126 tests a function called `sum`); without
    a solution, every name they use that is neither a builtin nor a standard module."""
    used = free_names(tests)
    try:
        with warnings.catch_warnings():  # MBPP solutions hold invalid escapes such as "\d"
            warnings.simplefilter("ignore", category=DeprecationWarning)
            warnings.simplefilter("ignore", category=SyntaxWarning)
            body = ast.parse(solution).body if solution.strip() else None
    except (SyntaxError, ValueError):
        body = None
    if body is None:
        return tuple(sorted(used - _BUILTIN_NAMES - sys.stdlib_module_names))
    defined: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(stmt.name)
        elif not isinstance(stmt, ast.Import | ast.ImportFrom):
            defined |= bound_names(stmt)
    return tuple(sorted(used & defined))


@lru_cache(maxsize=4096)
def check_plan(reference_answer: str) -> CheckPlan:
    """The plan of a reference answer, JSON {"tests", "names"?, "setup"?} (see `CodeEnv`). Without
    "names" (a reference written before they existed) the tests take every name they use that is
    neither a builtin nor a standard module."""
    spec = json.loads(reference_answer)
    tests = spec["tests"]
    used = free_names(tests)
    names = spec.get("names")
    if names is None:
        names = answer_names(tests, "")
    setup = spec.get("setup", "")
    modules = (used & sys.stdlib_module_names) - set(names)
    return CheckPlan(strict_tests(tests), tuple(names), tuple(sorted(modules)), setup)


def check_program(plan: CheckPlan, answer_code: str, marker: str) -> str:
    """The source run in the sandbox: setup, answer (after its own run of the setup) and tests in
    their namespaces, then the marker
    (written only if every test passed). Everything runs inside a function, so the answer finds
    none of the harness's names in `__main__`."""
    return f"""\
def _libra_main():
    import builtins, types
    fresh = dict(vars(builtins))  # before the answer can rebind anything in `builtins`
    # This function's own compile/exec too: the answer may rebind `builtins.compile` to turn the
    # tests into `pass` (a wrong answer scored correct until 2026-12-06); locals it cannot reach.
    _compile, _exec = fresh["compile"], fresh["exec"]
    checks = {{"__builtins__": dict(fresh), "__name__": "libra_strict"}}
    _exec(_compile({_CHECKER_SOURCE!r}, "libra_strict.py", "exec"), checks)
    tests = {{"__builtins__": dict(fresh), "__name__": "__main__", {STRICT!r}: checks["strict"]}}
    for name in {plan.modules!r}:
        try:
            module = __import__(name)
        except Exception:  # a test variable that shares a module's name: left to NameError
            continue
        tests[name] = types.ModuleType(name)
        vars(tests[name]).update(vars(module))
    _exec(_compile({plan.setup!r}, "setup.py", "exec"), tests)
    answer = {{"__builtins__": builtins, "__name__": "__main__"}}
    # The setup first in the answer's namespace too, as HumanEval's own harness runs prompt +
    # completion: an answer may use the prompt's imports (`List`) and helpers without repeating
    # them. The tests keep their own copy, which the answer cannot touch.
    _exec(_compile({plan.setup!r}, "setup.py", "exec"), answer)
    _exec(_compile({answer_code!r}, "solution.py", "exec"), answer)
    for name in {plan.names!r}:
        if name in answer:
            tests[name] = answer[name]
        else:
            tests.pop(name, None)
    _exec(_compile({plan.tests!r}, "tests.py", "exec"), tests)


_libra_main()
del _libra_main
{completion_line(marker)}"""


def completion_line(marker: str) -> str:
    """Source that writes `marker` to stdout, run after the last test. It flushes what the code
    printed first, then writes to file descriptor 1 directly (the answer may have replaced
    `sys.stdout`), under names the answer cannot have shadowed. The sandbox keeps stdout's first
    `max_output_bytes` and refuses writes past them (RLIMIT_FSIZE): an answer that fills stdout
    makes the flush or the write fail, so it does not pass - acceptable, tests print little."""
    return (
        "import os as _libra_os, sys as _libra_sys\n"
        "_libra_sys.stdout.flush()\n"
        f"_libra_os.write(1, b'\\n{marker}\\n')\n"
    )
