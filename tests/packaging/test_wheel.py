"""Installed as users install it: the wheel, in a fresh virtual environment, outside the checkout.

``python -m build`` makes the sdist and the wheel from a copy of the project's files; the wheel
goes into a new virtual environment with ``pip install <wheel>[examples]`` (no dev extras, no
Horovod: torch pinned to the CPU build this machine's pip finds on disk, installed without
compiling bytecode to keep the tier quick). There ``poprun --check-build`` answers, and the
digits demo runs as 2 instances x 2 replicas from a folder outside the checkout with no option
added: the default backend, ``auto``, takes torch.distributed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.jobs import ROOT
from tests.support.processes import run_in_session

pytestmark = [pytest.mark.packaging, pytest.mark.slow]

PACKAGES = ("poprun", "popdist", "popdist_torch", "popdist_lightning", "_popdist_poptorch")
PTH = "popdist-poptorch-modules.pth"  # the opt-in PopTorch names' hook (issue 54)
TORCH = "torch==2.13.0"  # the CPU build on this machine's disk: pip never pulls a CUDA torch


def _job(
    argv: list[str], *, venv: Path | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``argv`` in a session of its own, stdout and stderr merged; killed past ``timeout``.

    With ``venv``, as its user: from a folder outside the checkout (``python -c`` would
    import the checkout's packages from the current directory)."""
    where = cwd or (venv.parent if venv is not None else ROOT)
    try:
        return run_in_session(argv, env=_user_env(venv), cwd=where, timeout=timeout)
    except TimeoutError as error:
        pytest.fail(str(error))


def _run(argv: list[str], *, venv: Path | None = None, timeout: float = 300) -> str:
    done = _job(argv, venv=venv, timeout=timeout)
    assert done.returncode == 0, f"{argv} failed ({done.returncode}):\n{done.stdout[-3000:]}"
    return done.stdout


def _user_env(venv: Path | None = None) -> dict[str, str]:
    """A user's shell: no PYTHONPATH pointing at the checkout, the venv's bin first."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "POPDIST_", "OMPI_", "PMIX_", "HOROVOD_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
        env["VIRTUAL_ENV"] = str(venv)
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel, built by ``python -m build`` from a copy of the sources."""
    work = tmp_path_factory.mktemp("build")
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = work / "dist"
    # --no-isolation: the build backend (setuptools) of this environment, nothing downloaded.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)])
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtual environment holding the wheel with its [examples] extra, nothing else."""
    home = tmp_path_factory.mktemp("user") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", "--without-pip", str(home)])
    (wheel,) = dist.glob("*.whl")
    pip = [sys.executable, "-m", "pip", "--python", str(home / "bin" / "python")]
    _run([*pip, "install", "-q", "--no-compile", f"{wheel}[examples]", TORCH], timeout=600)
    yield home


def test_build_makes_an_sdist_and_a_typed_wheel_without_tests(dist: Path) -> None:
    (wheel,) = dist.glob("popdist_open-*-py3-none-any.whl")
    (sdist,) = dist.glob("popdist_open-*.tar.gz")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    for package in PACKAGES:
        assert f"{package}/py.typed" in names
    assert not [n for n in names if n.split("/")[0] in ("tests", "examples", "benchmarks")]
    assert "poprun/cli.py" in names and "popdist/collectives/auto.py" in names
    assert "poprun/run/status/page.html" in names  # --status-port's page
    assert "poprun/plan/allreduce.rules" in names  # Open MPI's allreduce rules on one host
    assert PTH in names  # at the root: pip puts it in site-packages
    (record,) = [n for n in names if n.endswith(".dist-info/RECORD")]
    with zipfile.ZipFile(wheel) as archive:
        assert f"{PTH},sha256=" in archive.read(record).decode()
    tops = {n.split("/")[0] for n in names}
    assert not tops & {"poptorch", "popart"}  # never a distribution or package of those names
    assert not [n for n in names if n.split("/")[0].startswith(("poptorch-", "popart-"))]
    with tarfile.open(sdist) as archive:
        members = archive.getnames()
    assert any(m.endswith("/pyproject.toml") for m in members)
    assert not [m for m in members if "/tests/" in m]


def test_the_wheel_installs_without_dev_extras_and_without_horovod(venv: Path) -> None:
    python = str(venv / "bin" / "python")
    code = (
        "import importlib.util as u; "
        "print([m for m in ('pytest', 'horovod', 'lightning', 'selenium') if u.find_spec(m)])"
    )
    assert _run([python, "-c", code], venv=venv).strip() == "[]"
    where = _run([python, "-c", "import popdist; print(popdist.__file__)"], venv=venv)
    assert where.startswith(str(venv)), where  # the installed copy, not the checkout's


def test_the_console_script_and_python_m_poprun_both_work(venv: Path) -> None:
    script = _run([str(venv / "bin" / "poprun"), "--version"], venv=venv)
    module = _run([str(venv / "bin" / "python"), "-m", "poprun", "--version"], venv=venv)
    assert script == module and script.startswith("poprun ")


def test_check_build_answers_in_the_fresh_environment(venv: Path) -> None:
    done = _job([str(venv / "bin" / "poprun"), "--check-build"], venv=venv)
    out = done.stdout
    assert done.returncode == 0, out
    assert f"({venv / 'bin' / 'python'})" in out
    assert "[ ] horovod: ModuleNotFoundError: No module named 'horovod'" in out
    assert "--backend auto takes: torch (horovod.torch does not import" in out
    assert "horovod (the horovod backend): missing horovod" in out
    assert "lightning (pip extra [lightning]): missing lightning" in out
    assert out.rstrip().endswith("poprun: a job can run here")


def test_the_digits_demo_runs_outside_the_checkout_on_the_auto_backend(
    venv: Path, tmp_path: Path
) -> None:
    """The demo from the installed wheel, outside the checkout, as a PopTorch user writes it
    (``import poptorch``, under ``--poptorch-modules``): the auto backend, the accuracy."""
    source = (ROOT / "examples" / "train_digits.py").read_text()
    assert "\nimport popdist_torch as poptorch\n" in source
    program = source.replace("\nimport popdist_torch as poptorch\n", "\nimport poptorch\n")
    (tmp_path / "train_digits.py").write_text(program)
    argv = [
        str(venv / "bin" / "poprun"),
        "--poptorch-modules",
        *("--num-instances", "2", "--num-replicas", "2"),
        "python",  # the venv's, first on PATH, as in an activated environment
        "train_digits.py",
    ]
    done = _job(argv, venv=venv, cwd=tmp_path)
    out = done.stdout
    assert done.returncode == 0, out[-3000:]
    assert "popdist: backend auto: torch, because horovod.torch does not import" in out
    match = re.search(r"global test accuracy ([0-9.]+) \((\d+)/450 samples, 2 instance", out)
    assert match, out[-3000:]
    assert float(match.group(1)) >= 0.9  # the demo's accuracy
    assert "weights identical on every instance" in out


LIBRARY = """
import importlib.metadata, importlib.util, json, sys
out = {"find_spec": importlib.util.find_spec("poptorch") is not None, "torch": "torch" in sys.modules}
out["metadata"] = importlib.metadata.version("poptorch")
import poptorch, poptorch.optim, popart, popdist_torch
from poptorch._impl import rewrapModelIfNecessary, unwrapModelIfNecessary
out["same"] = poptorch is popdist_torch and poptorch.optim is popdist_torch.optim
out["popart"] = popart is popdist_torch.popart
out["where"] = popdist_torch.__file__
out["ipu"] = poptorch.ipuHardwareVersion()
print(json.dumps(out))
"""

OFF = """
import importlib.util, json, sys
try:
    import poptorch
    found = "imported"
except ModuleNotFoundError as error:
    found = str(error)
print(json.dumps([found, importlib.util.find_spec("popart") is None, "_popdist_poptorch" in sys.modules]))
"""


def test_the_poptorch_names_are_off_without_the_variable(venv: Path) -> None:
    out = _run([str(venv / "bin" / "python"), "-c", OFF], venv=venv)
    assert json.loads(out) == ["No module named 'poptorch'", True, False]
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / PTH).is_file()


def test_the_poptorch_names_answer_from_the_wheel(venv: Path) -> None:
    env = {"POPDIST_POPTORCH_MODULES": "1"}
    done = run_in_session(
        [str(venv / "bin" / "python"), "-c", LIBRARY],
        env={**_user_env(venv), **env},
        cwd=venv.parent,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["where"].startswith(str(venv)), out  # the installed copy, not the checkout's
    assert out == {
        **out,
        "find_spec": True,
        "torch": False,
        "same": True,
        "popart": True,
        "ipu": 2,
    }
    assert out["metadata"].startswith("3.3.0+popdist.")
