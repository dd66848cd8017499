"""`libra`: the command line.

    libra run [CONFIG] [--set a.b=c ...] [--resume RUN_DIR]   run an experiment (ephemeral Prefect)
    libra config validate [CONFIG] [--set ...]                  check a stages.yaml; exit 2 on problems
    libra config show [CONFIG] [--set ...]                      print the resolved config
    libra trace export RUN_DIR -o FILE                          routing trace of a run (Parquet)
    libra trace-eval --trace FILE --buckets B1,B2 [--scheduler NAME|all] [--json OUT]
                                                                score schedulers on a trace
    libra plan --hardware 48xA800 --model qwen3-14b --workload PRESET|TRACE [--json]
                                                                plan GPUs and layouts
    libra simulate --scenario r2e-gym --hardware 48xA800 [--iterations N] [--policies all]
                                                                cluster-scale what-if simulation
    libra report RUN_DIR [--format html|md] [--out PATH]        report of a run (timeline, curves)
    libra serve [CONFIG] [--set ...] [--port 4200]              Prefect UI + deployments + schedule

Heavy modules (torch, vllm, prefect) are imported only by `run`, so config commands are instant.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

from flows.cli_common import EXIT_INTERRUPTED, input_path, raise_interrupted

EXIT_CONFIG_ERROR = 2
DEFAULT_CONFIG = "stages.yaml"


def _config_arg(value: str | None) -> str | None:
    if value is not None:
        return value
    return DEFAULT_CONFIG if Path(DEFAULT_CONFIG).is_file() else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="libra", description="Libra: agentic RL post-training runtime.")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_config_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("config", nargs="?", help=f"stages file (default: ./{DEFAULT_CONFIG} if present)")
        p.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config value, e.g. --set experiment.iterations=2 (repeatable)",
        )

    run = sub.add_parser("run", help="run an RL experiment")
    add_config_args(run)
    run.add_argument(
        "--resume", metavar="RUN_DIR", type=input_path, help="continue a run from its last checkpoint"
    )
    run.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show Prefect's logs, and the traceback of a failure (engine logs are in RUN_DIR/logs/)",
    )

    cfg = sub.add_parser("config", help="inspect configuration")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    add_config_args(cfg_sub.add_parser("validate", help="validate a stages file"))
    add_config_args(cfg_sub.add_parser("show", help="print the resolved config as YAML"))

    from flows import cli_trace

    cli_trace.add_parsers(sub, add_config_args)
    from flows import cli_plan

    cli_plan.add_parser(sub)
    from flows import cli_simulate

    cli_simulate.add_parser(sub)
    from flows import cli_report

    cli_report.add_parser(sub)
    from flows import cli_serve

    cli_serve.add_parser(sub, add_config_args)
    return parser


def _load(args: argparse.Namespace, path: str | Path | None = None) -> Any:
    """The validated config (`path`, else the CONFIG argument, plus `--set`); exit 2 on problems."""
    from libra_core.config import ConfigError, load_config
    from libra_core.config.errors import format_problems

    source = path if path is not None else _config_arg(args.config)
    try:
        cfg = load_config(source, args.overrides)
    except ConfigError as err:
        _config_problems(format_problems(err).splitlines())
    if cfg.planner.type == "libra":
        # Validation is pure; the planner's names and spec files are resolved here, so a wrong one
        # fails now rather than at the run's first plan stage.
        from libra_core.planner.service import LibraPlanner

        try:
            LibraPlanner.resolve_specs(cfg)
        except ValueError as err:
            _config_problems([f"{source or '<defaults>'}: {p}" for p in str(err).splitlines()])
    return cfg


def _config_problems(lines: list[str]) -> NoReturn:
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]invalid configuration[/] ({len(lines)} problem(s)):")
    print("\n".join(lines), file=sys.stderr)
    raise SystemExit(EXIT_CONFIG_ERROR) from None


def _check_machine(cfg: Any, source: str | None) -> None:
    """Exit 2 listing what this machine cannot run (libra_core/pipeline/preflight.py)."""
    from libra_core.pipeline.preflight import machine_problems

    problems = machine_problems(cfg)
    if problems:
        _config_problems([f"{source or '<defaults>'}: {p}" for p in problems])


def _load_runnable(args: argparse.Namespace) -> Any:
    """`_load`, then `_check_machine`: the config of a run this machine starts (run, serve)."""
    cfg = _load(args)
    _check_machine(cfg, _config_arg(args.config))
    return cfg


def _cmd_config(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if args.config_command == "validate":
        _check_machine(cfg, _config_arg(args.config))
        from flows.cli_common import fail, output_problem

        # as `libra run` and `libra serve` check it (until 2026-12-07 validate passed an output
        # folder under a file, which both then refused), but without creating it: validate writes
        # nothing (it made the folder, 2026-12-07)
        problem = output_problem(cfg.experiment.output_path, folder=True)
        if problem:
            return fail(f"experiment.output_dir: {problem}")
        from rich.console import Console
        from rich.text import Text

        where = str(_config_arg(args.config) or "<defaults>")  # a path may hold `[...]`: not markup
        Console(soft_wrap=True).print(Text.assemble(("ok", "green"), f": {where} is valid"))
    else:
        from libra_core.config import config_to_yaml

        print(config_to_yaml(cfg), end="")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from flows.cli_common import fail

    if args.resume is not None:  # `--resume ''` is refused by input_path; no blank means a fresh run
        from libra_core.config.loader import RESOLVED_CONFIG_NAME

        if args.config:  # the run's own resolved config is what resumes; another would be ignored
            return fail(
                f"--resume {args.resume} continues with the run's own config; drop {args.config} "
                "(change settings with --set)",
                EXIT_CONFIG_ERROR,
            )
        if not (Path(args.resume) / RESOLVED_CONFIG_NAME).is_file():
            return fail(
                f"--resume {args.resume}: not a run folder (no {RESOLVED_CONFIG_NAME})", EXIT_CONFIG_ERROR
            )
        # The run's resolved config with this command's --set, and what the resume would do, checked
        # before Prefect starts (the create-run task checks the same again, then applies it).
        resolved = Path(args.resume) / RESOLVED_CONFIG_NAME
        cfg = _load(args, resolved)
        note = _check_resume(args.resume, args.overrides)  # first: "cannot change on resume" says more
        if note is None:
            return EXIT_CONFIG_ERROR
        _check_machine(cfg, str(resolved))
        print(f"libra: {note}", file=sys.stderr)
        config_path = None
    else:
        cfg = _load_runnable(args)  # fail fast, before importing torch/vllm/prefect
        from flows.cli_common import folder_write_problem

        problem = folder_write_problem(cfg.experiment.output_path)
        if problem:
            return fail(f"experiment.output_dir: {problem}")
        config_path = _config_arg(args.config)
    if not args.verbose:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.prefect_server import choose_api_for_run

    where = choose_api_for_run()  # before Prefect is imported: it reads PREFECT_API_URL once
    if where:
        from rich.console import Console

        # markup off: the message holds PREFECT_API_URL, and `[fd00::1]` in it is no markup tag;
        # soft wrap: one line however narrow the terminal (a log or a grep reads it whole)
        Console(stderr=True, soft_wrap=True).print(where, highlight=False, markup=False)
    from flows.progress_view import run_with_progress

    # SIGTERM (kill, a job scheduler) ends the run like Ctrl-C. During the flow Prefect's own
    # handler turns it into TerminationSignal, and afterwards re-sends it to this process under the
    # handler it found; the default one would kill the process on the spot, skipping the exit
    # handlers that stop the ephemeral Prefect server and the run's engines and trainer process.
    # SIGHUP (the terminal closed, an ssh session dropped) too: until 2026-12-06 it killed the run
    # on the spot, and its engines, in sessions of their own, kept running.
    signal.signal(signal.SIGTERM, raise_interrupted)
    signal.signal(signal.SIGHUP, raise_interrupted)
    try:  # Prefect's import takes seconds: a signal then printed a traceback (until 2026-12-07)
        from prefect.exceptions import CancelledRun

        from flows import rl_experiment
    except KeyboardInterrupt:
        print("libra: run interrupted before its run folder was made; nothing to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    known = len(rl_experiment.started_runs)
    try:
        return run_with_progress(config_path, args.overrides, args.resume)
    except (KeyboardInterrupt, CancelledRun) as err:  # CancelledRun: a Cancel in the Prefect UI
        how = "cancelled from the Prefect UI" if isinstance(err, CancelledRun) else "interrupted"
        where = _run_folder(args, rl_experiment.started_runs[known:])
        if where is None:
            print(f"libra: run {how} before its run folder was made; nothing to resume", file=sys.stderr)
        else:
            print(f"libra: run {how}; resume it with `libra run --resume {where}`", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:
        # Prefect has logged the traceback; what was missing is the folder and how to go on. -v
        # keeps Python's traceback too.
        if args.verbose:
            raise
        print(f"libra: run failed: {type(err).__name__}: {err}", file=sys.stderr)
        where = _run_folder(args, rl_experiment.started_runs[known:])
        if where is not None:
            print(
                f"libra: run folder {where}; once the cause is fixed, resume it with "
                f"`libra run --resume {where}`",
                file=sys.stderr,
            )
        return 1


def _run_folder(args: argparse.Namespace, started: list[str]) -> str | None:
    """The run folder this command started or resumed (None: it failed before making one)."""
    return started[-1] if started else args.resume


def _check_resume(run_dir: str, overrides: list[str]) -> str | None:
    """What `--resume` will do (one line), or None after printing why it is refused."""
    from flows.cli_common import fail
    from libra_core.pipeline.resume import ResumeError, plan_resume
    from libra_core.pipeline.run_lock import run_holder

    holder = run_holder(run_dir)
    if holder is not None:
        fail(f"run folder {run_dir} is in use by process {holder} (a run or a resume of it)")
        return None
    try:
        return plan_resume(run_dir, overrides).note
    except (ResumeError, ValueError) as err:
        fail(str(err))
        return None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code = _main(args)
        sys.stdout.flush()  # here, not at exit: a pipe's reader may be gone
        return code
    except KeyboardInterrupt:
        # Ctrl-C in a command that does not handle it itself (`run`, `simulate` and `serve` do, and
        # say how to go on): a traceback and exit -2 until 2026-12-07. Every file a command writes
        # goes through atomic_path, so none is left half-written.
        print(f"libra {args.command}: interrupted; no file was left half-written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`libra plan --top 20 | head -1`): for a command that only prints,
        # what it read is what it wanted (a traceback and exit 1 until 2026-12-07). stdout goes to
        # /dev/null so that the flush at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        if args.command in ("run", "serve", "simulate"):  # their work stopped half-way: not a success
            print(f"libra {args.command}: standard output was closed; stopped", file=sys.stderr)
            return 1
        return 0


def _main(args: argparse.Namespace) -> int:
    if args.command == "config":
        return _cmd_config(args)
    if args.command == "serve":
        from flows import cli_serve

        return cli_serve.cmd_serve(args, _load_runnable, _config_arg(args.config))
    if args.command == "simulate":
        from flows import cli_simulate

        return cli_simulate.cmd_simulate(args)
    if args.command == "report":
        from flows import cli_report

        return cli_report.cmd_report(args)
    if args.command == "plan":
        from flows import cli_plan

        return cli_plan.cmd_plan(args)
    if args.command in ("trace", "trace-eval"):
        from flows import cli_trace

        if args.command == "trace":
            return cli_trace.cmd_trace(args)
        return cli_trace.cmd_trace_eval(args, _load, _config_arg(args.config))
    return _cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
