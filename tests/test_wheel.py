"""The package as a user installs it: the wheel is built from the source tree and installed into
a fresh virtual environment, where ``mechsink scan`` runs without the working tree in reach.

The fresh environment gets no download: its own site-packages holds only the wheel, and a
``.pth`` line (added after the install, so pip never sees the editable checkout) appends the
running interpreter's site-packages for the dependencies (torch, TransformerLens, ...).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mechsink"


def _version_in_source() -> str:
    """``mechsink.__version__`` as written in the source (read as text, not imported)."""
    text = (PACKAGE / "__init__.py").read_text(encoding="utf-8")
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def _package_files() -> set[str]:
    """Every file of the package in the source tree, as a wheel names it."""
    return {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def _env() -> dict[str, str]:
    """The environment for the fresh venv's processes: nothing points at the working tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1", OMP_NUM_THREADS="1",
               MECHSINK_PROGRESS="0", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def _run(cmd: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def _build_wheel(tmp: Path) -> tuple[Path, str]:
    """Build the wheel from a copy of what the build reads (the source tree stays clean);
    returns the wheel and the build's output."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", *(p.name for p in ROOT.glob("LICENSE*"))):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(PACKAGE, src / "mechsink",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    if importlib.util.find_spec("build") is not None:
        cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, src]
    else:
        cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
               "--wheel-dir", dist, src]
    proc = _run(cmd, cwd=tmp)
    wheels = list(dist.glob("mechsink-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0], proc.stdout + proc.stderr


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_scans(tmp_path: Path) -> None:
    version = _version_in_source()
    wheel, log = _build_wheel(tmp_path)
    assert wheel.name == f"mechsink-{version}-py3-none-any.whl"
    assert "`project.license` as a TOML table is deprecated" not in log

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = zf.read(f"mechsink-{version}.dist-info/METADATA").decode()
        entry_points = zf.read(f"mechsink-{version}.dist-info/entry_points.txt").decode()
    missing = _package_files() - names
    assert not missing, f"files of the package left out of the wheel: {sorted(missing)}"
    assert "License-Expression: MIT" in meta and f"Version: {version}" in meta
    assert "mechsink = mechsink.app.cli:app" in entry_points

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
          "--quiet", wheel], cwd=tmp_path)
    own = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               cwd=tmp_path).stdout.strip()
    # the dependencies: this interpreter's site-packages, as a plain path line (its own .pth
    # files, among them an editable install of mechsink, are not run)
    (Path(own) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = _run([python, "-c", "import importlib.metadata as m, mechsink; "
                  "print(mechsink.__file__); print(mechsink.__version__); "
                  "print(m.version('mechsink'))"], cwd=tmp_path).stdout.split()
    assert Path(where[0]).resolve().is_relative_to(Path(own).resolve()), where
    assert where[1:] == [version, version]

    out = tmp_path / "report"
    _run([venv / "bin" / "mechsink", "scan", "random:gpt2-tiny", "--out", out, "--n", "2",
          "--seq-len", "16"], cwd=tmp_path)
    census = json.loads((out / "census.json").read_text(encoding="utf-8"))
    assert census["mechsink_version"] == version
    assert census["model"] == "random:gpt2-tiny"
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "random:gpt2-tiny" in page and "http://" not in page and "https://" not in page

    # the bundled organism is package data: it loads from the installed wheel
    info = _run([venv / "bin" / "mechsink", "info", "organism:bb-gpt2-tiny", "--prompt",
                 "t0 t1 t2 t3", "--tokens", "2"], cwd=tmp_path).stdout
    assert "organism:bb-gpt2-tiny" in info
