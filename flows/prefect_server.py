"""Finding, checking and starting a Prefect server (used by `libra serve` and `libra run`).

No Prefect import here: these helpers run before Prefect is imported, because Prefect reads
`PREFECT_API_URL` and friends from the environment when it is first imported.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def api_healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    """True when `<api_url>/health` answers (api_url ends in /api)."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on `host` now: an IPv4 or IPv6 address, or a name, bound in the family
    it resolves to (`::1` needs an IPv6 socket). Raises OSError when `host` does not resolve or is
    not an address of this machine."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with socket.socket(family, kind, proto) as s:
        s.bind(address)
        return int(s.getsockname()[1])


def http_url(host: str, port: int) -> str:
    """`http://host:port`, with an IPv6 literal in brackets (`http://[::1]:4200`, RFC 3986): without
    them the port cannot be told from the address."""
    bare = host.removeprefix("[").removesuffix("]")
    return f"http://[{bare}]:{port}" if ":" in bare else f"http://{bare}:{port}"


# Prefect's setting of the API address the UI's pages call, under its two names (Prefect reads
# either): set by the user, it is theirs (Prefect's documented remedy for a server reached from
# another machine); unset, `start_server` sets it to the address the server listens on.
UI_API_URL_VARS = ("PREFECT_UI_API_URL", "PREFECT_SERVER_UI_API_URL")


def user_ui_api_url() -> str | None:
    """The API address the user told Prefect's UI to call (None: they did not)."""
    for name in UI_API_URL_VARS:
        if os.environ.get(name):
            return os.environ[name]
    return None


def is_wildcard_host(host: str) -> bool:
    """True for an address that listens on every interface (`0.0.0.0`, `::`): a server reached from
    another machine is not reached at it, so a UI told to call it calls the browser's own machine."""
    bare = host.removeprefix("[").removesuffix("]")
    return bare in ("", "0.0.0.0", "::", "0:0:0:0:0:0:0:0")


@dataclass
class LocalServer:
    """A `prefect server start` subprocess owned by this process. `ui_api_url`: the API address
    the UI's pages call (the user's PREFECT_UI_API_URL when set, else `api_url`)."""

    process: subprocess.Popen[bytes]
    api_url: str
    ui_url: str
    log_path: Path
    ui_api_url: str

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_server(host: str, port: int, log_path: Path, timeout_s: float = 90.0) -> LocalServer:
    """Start `prefect server start` on host:port and wait until its API is healthy.

    `host` is an address or name as uvicorn takes it (an IPv6 literal without brackets, `::1`);
    the URLs built from it bracket IPv6 literals.

    The database is Prefect's default (SQLite under PREFECT_HOME) unless
    PREFECT_API_DATABASE_CONNECTION_URL says otherwise. The UI calls the API at the user's
    PREFECT_UI_API_URL (or PREFECT_SERVER_UI_API_URL) when set, else at `http://host:port/api`.
    Raises RuntimeError with the log's tail if the server exits or does not answer in time.
    """
    ui_url = http_url(host, port)
    api_url = f"{ui_url}/api"
    if api_healthy(api_url, 0.5):
        raise RuntimeError(f"something already answers on {ui_url}; pass --api-url {api_url} to use it")
    ui_api_url = user_ui_api_url()
    env = {
        **os.environ,
        "PREFECT_SERVER_API_HOST": host,
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    if ui_api_url is None:  # the user's is in os.environ already
        ui_api_url = env["PREFECT_UI_API_URL"] = api_url
    env.pop("PREFECT_API_URL", None)  # the server itself must not point at another API
    log_path.parent.mkdir(parents=True, exist_ok=True)
    prefect_cli = Path(sys.executable).with_name("prefect")
    cmd = [str(prefect_cli)] if prefect_cli.exists() else [sys.executable, "-m", "prefect"]
    with log_path.open("ab") as log:
        start = log.tell()  # the log is kept across starts: quote only this start's lines
        proc = subprocess.Popen(
            [*cmd, "server", "start"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = LocalServer(proc, api_url, ui_url, log_path, ui_api_url)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = _tail(log_path, start)
                raise RuntimeError(f"Prefect server exited with code {proc.returncode}:\n{tail}")
            if api_healthy(api_url, 1.0):
                return server
            time.sleep(0.5)
    except BaseException:
        # Ctrl-C or SIGTERM while it starts: it runs in its own session, so no signal reaches it
        # and nothing else would stop it (it would keep the port).
        server.stop()
        raise
    server.stop()
    raise RuntimeError(
        f"Prefect server did not answer on {api_url} within {timeout_s:.0f}s:\n{_tail(log_path, start)}"
    )


def _tail(path: Path, start: int = 0, lines: int = 20) -> str:
    """The last `lines` lines written to `path` from byte `start` on (an earlier start's lines,
    with their other port and URLs, were quoted above this one's error until 2026-12-07)."""
    try:
        with path.open("rb") as fh:
            fh.seek(start)
            text = fh.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _profiles_path() -> Path:
    """Prefect's profiles file, as Prefect finds it (PREFECT_PROFILES_PATH, else PREFECT_HOME's)."""
    home = Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()
    return Path(os.environ.get("PREFECT_PROFILES_PATH", home / "profiles.toml")).expanduser()


def _settings_may_name_an_api() -> bool:
    """Whether a Prefect settings file may set the API URL: the active profile (what `prefect
    config set PREFECT_API_URL=...` writes), or `.env`, `prefect.toml` or `pyproject.toml` in the
    working folder. Only then is the slower exact check (`_configured_api_url`) worth its second."""
    for path in (_profiles_path(), Path(".env"), Path("prefect.toml"), Path("pyproject.toml")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if "PREFECT_API_URL" in text or re.search(r"^\s*\[(tool\.prefect\.)?api\]|api\.url", text, re.M):
            return True
    return False


def _profile_without_api_url() -> bool:
    """Point PREFECT_PROFILES_PATH at a copy of the profiles file whose active profile has no
    PREFECT_API_URL (its other settings kept); False, changing nothing, when there is no such
    profile or it cannot be copied as written (values other than strings, numbers, booleans)."""
    try:
        data = tomllib.loads(_profiles_path().read_text())
    except (OSError, ValueError):
        return False
    profiles = data.get("profiles")
    active = os.environ.get("PREFECT_PROFILE") or data.get("active")
    if not isinstance(profiles, dict) or not isinstance(profiles.get(active), dict):
        return False
    if "PREFECT_API_URL" not in profiles[active]:
        return False
    lines = [f"active = {json.dumps(active)}"]
    for name, settings in profiles.items():
        if not isinstance(settings, dict):
            return False
        lines.append(f"\n[profiles.{json.dumps(name)}]")
        for key, value in settings.items():
            if name == active and key == "PREFECT_API_URL":
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, str | int) or (isinstance(value, float) and math.isfinite(value)):
                text = json.dumps(value)  # a JSON string or number is a TOML one
            else:
                return False
            lines.append(f"{json.dumps(key)} = {text}")
    fd, copy = tempfile.mkstemp(prefix="libra-prefect-profiles-", suffix=".toml")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    atexit.register(Path(copy).unlink, missing_ok=True)
    os.environ["PREFECT_PROFILES_PATH"] = copy
    return True


def _configured_api_url() -> str | None:
    """The API URL Prefect would use from its settings files, read in a child process: Prefect
    reads its settings once, when it is first imported, and this process must not import it yet
    (an override set after that is not seen)."""
    probe = "from prefect.settings import get_current_settings as s; print(s().api.url or '')"
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None  # Prefect's own error shows when the run imports it
    return lines[-1].strip() or None


def choose_api_for_run() -> str | None:
    """For `libra run`: the configured API if it answers; otherwise an ephemeral API, and say so.
    Called before Prefect is imported. The API comes from PREFECT_API_URL in the environment or,
    without it, from Prefect's settings files (a profile set by `prefect config set`); until
    2026-12-06 only the environment was checked, and a profile naming a stopped server ended the
    run in a traceback. The fallback unsets PREFECT_API_URL; a profile's URL is left out of a
    temporary copy of the profiles file (PREFECT_PROFILES_PATH); only a URL from `.env`,
    `prefect.toml` or `pyproject.toml` sets PREFECT_API_URL to empty, which Prefect reads as "no
    server" but which costs an error and tracebacks from its event service at exit. It also allows
    the ephemeral API.

    Returns a one-line message for the user (None when nothing needs saying)."""
    url = os.environ.get("PREFECT_API_URL")
    source = "PREFECT_API_URL"
    in_files = _settings_may_name_an_api()
    if url is None and in_files:
        url, source = _configured_api_url(), "the active Prefect profile or settings file"
    if not url:
        return None
    if api_healthy(url):
        return f"Prefect server: {url.removesuffix('/api')} (this run appears in its UI)"
    os.environ.pop("PREFECT_API_URL", None)
    # Unset, Prefect runs ephemerally and exits cleanly. Set to "" (which overrides a settings
    # file's URL) its event service logged "Service 'EventsWorker' failed" and printed "Cannot put
    # items in a stopped service instance" tracebacks at exit, after a successful run: so a
    # profile's URL is left out of a copy of the profiles file instead, and "" is the last resort.
    if in_files and not (_profile_without_api_url() and _configured_api_url() is None):
        os.environ["PREFECT_API_URL"] = ""
    # A profile of one's own may not allow the ephemeral API that the default profile allows.
    os.environ["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] = "true"
    return (
        f"Prefect server at {url} (from {source}) is not reachable; running with an ephemeral Prefect "
        "API instead (the run works the same, but will not appear in that server's UI)"
    )
