"""Output paths of the `libra` commands: every file a command writes is checked before its work,
inputs it reads are never replaced, and `~` means the home folder both in the check and in the
write (subprocess, as a user runs them)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_cli import ROOT, libra
from tests.observability.test_report import make_run


def _error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    return out.stderr.replace("\n", "")


def _synth(path: Path) -> Path:
    out = libra("trace", "synth", "-o", str(path))
    assert out.returncode == 0, out.stderr
    return path


def libra_home(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`libra ARGS` run in `cwd` with HOME=`home`: where a `~` in an argument must land."""
    import matplotlib

    # the plots' font cache stays where it was built: a fresh HOME would rebuild it per call
    env = {"HOME": str(home), "MPLCONFIGDIR": matplotlib.get_cachedir()}
    return libra(*args, cwd=cwd, env=env, timeout_s=120)


def test_trace_eval_json_does_not_replace_its_config(tmp_path: Path) -> None:
    trace = _synth(tmp_path / "t.parquet")
    config = tmp_path / "my.yaml"
    shutil.copy(ROOT / "stages.yaml", config)
    before = config.read_bytes()
    args = ("trace-eval", "--trace", str(trace), "--buckets", "54,64", "--scheduler", "static")
    # the config given as CONFIG
    err = _error(libra(*args, "--json", str(config), str(config)))
    assert f"{config}: is an input of this command" in err and config.read_bytes() == before
    # the implicit ./stages.yaml of the working folder (relative and absolute --json)
    (tmp_path / "stages.yaml").write_bytes(before)
    for out in ("stages.yaml", str(tmp_path / "stages.yaml")):
        err = _error(libra(*args, "--json", out, cwd=tmp_path))
        assert "is an input of this command" in err
        assert (tmp_path / "stages.yaml").read_bytes() == before
    # another file is written
    assert libra(*args, "--json", str(tmp_path / "m.json"), cwd=tmp_path).returncode == 0
    assert [r["scheduler"] for r in json.loads((tmp_path / "m.json").read_text())] == ["static"]


def test_report_checks_its_default_output_path(tmp_path: Path) -> None:
    run = make_run(tmp_path / "runs")
    (run / "report.html").mkdir()
    err = _error(libra("report", str(run)))
    assert f"{run / 'report.html'}: is a folder; give a file name" in err
    (run / "report.html").rmdir()
    (run / "report.md").mkdir()
    assert f"{run / 'report.md'}: is a folder; give a file name" in _error(
        libra("report", str(run), "--format", "md")
    )
    (run / "report.md").rmdir()
    assert libra("report", str(run)).returncode == 0 and (run / "report.html").is_file()


def test_report_md_checks_its_png_paths_before_writing_anything(tmp_path: Path) -> None:
    run = make_run(tmp_path / "runs")
    # the default output: RUN/report.md and RUN/report_<figure>.png
    (run / "report_curves.png").mkdir()
    err = _error(libra("report", str(run), "--format", "md"))
    assert f"{run / 'report_curves.png'}: is a folder; give a file name" in err
    # neither the report nor another figure was written
    assert [p.name for p in run.glob("report*")] == ["report_curves.png"]
    # --out: the PNGs are <stem>_<figure>.png next to it
    out = tmp_path / "md" / "r.md"
    (out.parent / "r_timeline_last.png").mkdir(parents=True)
    err = _error(libra("report", str(run), "--format", "md", "--out", str(out)))
    assert f"{out.parent / 'r_timeline_last.png'}: is a folder; give a file name" in err
    assert sorted(p.name for p in out.parent.iterdir()) == ["r_timeline_last.png"]
    (out.parent / "r_timeline_last.png").rmdir()
    assert libra("report", str(run), "--format", "md", "--out", str(out)).returncode == 0
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "r.md",
        "r_curves.png",
        "r_timeline_last.png",
        "r_timeline_run.png",
    ]


@pytest.mark.parametrize("command", ["report", "trace synth", "trace-eval", "simulate"])
def test_a_tilde_in_an_output_path_is_the_home_folder(tmp_path: Path, command: str) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    # `--out=~/x`: one word, which a shell leaves as it is
    if command == "report":
        run = make_run(tmp_path / "runs")
        out = libra_home(home, cwd, "report", str(run), "--out=~/r.html")
        assert out.returncode == 0, out.stderr
        assert (home / "r.html").is_file() and out.stdout.strip() == str(home / "r.html")
    elif command == "trace synth":
        out = libra_home(home, cwd, "trace", "synth", "--output=~/t.parquet")
        assert out.returncode == 0, out.stderr
        assert (home / "t.parquet").is_file()
    elif command == "trace-eval":
        trace = _synth(tmp_path / "t.parquet")
        out = libra_home(home, cwd, "trace-eval", "--trace", str(trace), "--buckets", "54,64",
                         "--scheduler", "static", "--json=~/m.json")  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert json.loads((home / "m.json").read_text())[0]["scheduler"] == "static"
        # the check sees the path the write would: `~/t.parquet` here is the trace it reads
        out = libra_home(home, tmp_path, "trace-eval", "--trace", "t.parquet", "--buckets", "54",
                         "--json=~/../t.parquet")  # fmt: skip
        assert f"{home}/../t.parquet: is an input of this command" in _error(out)
    else:
        out = libra_home(home, cwd, "simulate", "--scenario", "tiny", "--hardware", "8xA800",
                         "--iterations", "1", "--policies", "greedy", "--out=~/sim")  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert (home / "sim" / "summary.json").is_file()
    assert not list(cwd.iterdir())  # no `./~` folder
