"""`libra serve`: the Prefect control room for an experiment.

    libra serve [CONFIG] [--set a.b=c ...] [--port 4200] [--host 127.0.0.1] [--api-url URL]

Starts a Prefect server (or connects to one with --api-url / PREFECT_API_URL), registers two
deployments, `rl-experiment/experiment` (parameters: config path and overrides; the nightly
schedule from the config's `schedule:` section) and `simulate/simulate`, then runs whatever the
UI, the API or the schedule starts, until Ctrl-C. Runs use the same flow as `libra run`.
Exit 2 on an invalid config; 1 when the server cannot be started or reached.
"""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Callable
from typing import Any

from flows.cli_common import fail, raise_interrupted

EXIT_CONFIG_ERROR = 2
EXIT_SERVER_ERROR = 1


def add_parser(
    sub: argparse._SubParsersAction, add_config_args: Callable[[argparse.ArgumentParser], None]
) -> None:
    p = sub.add_parser("serve", help="start the Prefect UI and serve the experiment and simulate deployments")
    add_config_args(p)
    p.add_argument(
        "--host", default="127.0.0.1", help="address the started server listens on (IPv4 or IPv6, e.g. ::1)"
    )
    p.add_argument("--port", type=int, default=4200, help="port of the started server (0: a free one)")
    p.add_argument(
        "--api-url",
        default=None,
        help="use this running Prefect server (e.g. http://host:4200/api) instead of starting one; "
        "default: PREFECT_API_URL if set",
    )
    p.add_argument("--limit", type=int, default=1, help="flow runs executed at once (default 1)")


def cmd_serve(
    args: argparse.Namespace, load: Callable[[argparse.Namespace], Any], config_path: str | None
) -> int:
    from rich.console import Console

    from flows.cli_common import folder_write_problem
    from flows.prefect_server import (
        api_healthy,
        free_port,
        http_url,
        is_wildcard_host,
        start_server,
        user_ui_api_url,
    )

    console = Console(stderr=True, soft_wrap=True)  # one line each, however narrow (logs, grep)
    cfg = load(args)  # exits 2 with one line per problem
    if args.limit < 1:
        return fail(f"--limit must be >= 1, got {args.limit}", EXIT_CONFIG_ERROR)
    if not 0 <= args.port <= 65535:
        return fail(f"--port must be in 0..65535, got {args.port}", EXIT_CONFIG_ERROR)
    # As `libra run` checks it: the served config's runs write there, and so does the server's log.
    problem = folder_write_problem(cfg.experiment.output_path)
    if problem:
        return fail(f"experiment.output_dir: {problem}", EXIT_CONFIG_ERROR)
    server = None
    # Ctrl-C and SIGTERM both stop serving and the server we started (a shell may have started us
    # with SIGINT ignored, e.g. in the background); installed before the server starts, so an
    # interrupt while it starts stops it too (start_server).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_interrupted)
    api_url = args.api_url or os.environ.get("PREFECT_API_URL")
    if api_url:
        if not api_healthy(api_url):
            source = (
                ""
                if args.api_url
                else " (from PREFECT_API_URL in the environment: unset it to start a server here, or "
                "start the server it names)"
            )
            return fail(f"no Prefect server answers at {api_url}{source}", EXIT_SERVER_ERROR)
        ui_url = api_url.rstrip("/").removesuffix("/api")
    else:
        host = args.host.removeprefix("[").removesuffix("]")  # uvicorn takes `::1`, not `[::1]`
        try:
            port = args.port or free_port(host)
        except OSError as err:  # a name that does not resolve, an address not on this machine
            return fail(f"--host {args.host}: no free port to listen on ({err})", EXIT_SERVER_ERROR)
        log = cfg.experiment.output_path / ".prefect-server.log"
        # markup off: the log's path comes from experiment.output_dir, and `[/x]` in it is no tag
        console.print(
            f"starting Prefect server on {http_url(host, port)} (log: {log}) ...",
            highlight=False,
            markup=False,
        )
        if is_wildcard_host(host) and user_ui_api_url() is None:
            # The UI's pages call the API from the browser: at 0.0.0.0 that is the browser's machine.
            console.print(
                f"note: the UI's pages will call the API at {http_url(host, port)}/api, which a browser "
                "on another machine cannot reach; for remote access, export PREFECT_UI_API_URL="
                f"{http_url('HOST', port)}/api (HOST: this machine's name or address as that browser "
                "reaches it) before `libra serve`",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        try:
            server = start_server(host, port, log)
        except RuntimeError as err:
            return fail(str(err), EXIT_SERVER_ERROR)
        except OSError as err:  # its log cannot be written, or prefect cannot be executed
            return fail(f"cannot start the Prefect server: {err}", EXIT_SERVER_ERROR)
        except KeyboardInterrupt:  # the server it was starting is stopped
            return 130
        api_url, ui_url = server.api_url, server.ui_url
    os.environ["PREFECT_API_URL"] = api_url
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        from flows.serve import build_deployments, serve_forever

        try:
            deployments = build_deployments(config_path, list(args.overrides), cfg)
        except ValueError as err:  # Prefect's cron and time-zone checks are stricter than the config's
            return fail(
                f"schedule (cron {cfg.schedule.cron!r}, {cfg.schedule.timezone}): {err}", EXIT_CONFIG_ERROR
            )
        sched = cfg.schedule
        when = (
            f"cron {sched.cron!r} ({sched.timezone}{'' if sched.active else ', paused'})"
            if sched.cron
            else "none"
        )
        print(f"Prefect UI: {ui_url}", flush=True)
        print(f"deployments: rl-experiment/experiment (schedule: {when}), simulate/simulate", flush=True)
        print("serving (deployments register in a moment); Ctrl-C to stop", flush=True)
        serve_forever(deployments, args.limit)
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.stop()
    return 0
