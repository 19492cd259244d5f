"""``import poptorch`` in fresh interpreters: off by default, a library's checks under the opt-in,
a real PopTorch winning, and ``poprun --poptorch-modules`` for every instance (issue 54).

The finder's logic is tests/unit/test_poptorch_modules.py; the wheel installed in a fresh
environment, tests/packaging/test_wheel.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.jobs import ROOT, job_env, poprun_argv, run_job

pytestmark = [pytest.mark.launch]

VARIABLE = "POPDIST_POPTORCH_MODULES"
LIBRARY = str(ROOT / "tests" / "bin" / "poptorch_library.py")

OFF = """
import importlib.metadata, importlib.util, json, sys
out = {"find_spec": importlib.util.find_spec("poptorch") is not None}
for name in ("poptorch", "popart"):
    try:
        __import__(name)
        out[name] = "imported"
    except ModuleNotFoundError as error:
        out[name] = str(error)
try:
    importlib.metadata.version("poptorch")
    out["metadata"] = "found"
except importlib.metadata.PackageNotFoundError:
    out["metadata"] = None
out["hook"] = "_popdist_poptorch" in sys.modules
out["finders"] = [type(f).__name__ for f in sys.meta_path]
print(json.dumps(out))
"""


def _python(code: str, **env: str) -> dict[str, Any]:
    done = run_job([sys.executable, "-c", code], env=job_env(**env), timeout=120)
    assert done.returncode == 0, done.stdout
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("value", [None, "0"])
def test_off_nothing_changes(value: str | None) -> None:
    out = _python(OFF) if value is None else _python(OFF, **{VARIABLE: value})
    assert "Finder" not in out.pop("finders")
    assert out == {
        "find_spec": False,
        "poptorch": "No module named 'poptorch'",
        "popart": "No module named 'popart'",
        "metadata": None,
        "hook": False,  # the .pth line read the variable and imported nothing
    }


def test_a_library_finds_poptorch_and_gets_the_projects_modules() -> None:
    env = job_env(**{VARIABLE: "1", "HF_HUB_OFFLINE": "1"})  # transformers asks nothing online
    done = run_job([sys.executable, LIBRARY], env=env, timeout=180)
    assert done.returncode == 0, done.stdout
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("LIBRARY "))
    report = json.loads(line.removeprefix("LIBRARY "))
    assert report == {
        **report,
        "find_spec": True,
        "torch_before_import": False,
        "metadata": report["version"].replace("-", "+", 1),
        "require_version": True,
        "same_module": True,
        "same_objects": True,
        "popdist_options": True,
        "ipu_version": 2,
        "ipu_available": [True, True],  # one process: it is its own run
        "isinstance": True,
        "popart_value": 1,
        "core_error": True,
        "duplicates": [],
        "aliases_are_project_modules": True,
        "spec_kept": True,
    }
    assert report["version"].startswith("3.3.0-popdist.")
    assert {"poptorch", "poptorch.optim", "poptorch._impl", "popart"} <= set(report["aliases"])
    assert report["project_modules"] > 20


def _real_poptorch(root: Path) -> None:
    """A stand-in for Graphcore's wheel: the package and its dist-info."""
    (root / "poptorch").mkdir()
    (root / "poptorch" / "__init__.py").write_text(
        "__version__ = '3.4.0-f00dfeed00'\nREAL = True\n"
    )
    info = root / "poptorch-3.4.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: poptorch\nVersion: 3.4.0\n")
    (info / "RECORD").write_text("")


def test_a_real_poptorch_wins_with_one_line(tmp_path: Path) -> None:
    _real_poptorch(tmp_path)
    code = (
        "import importlib.metadata, json, poptorch;"
        "print(json.dumps([getattr(poptorch, 'REAL', False), poptorch.__version__,"
        " importlib.metadata.version('poptorch')]))"
    )
    env = job_env(**{VARIABLE: "1"})
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    done = run_job([sys.executable, "-c", code], env=env, timeout=120)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.strip().splitlines()
    assert json.loads(lines[-1]) == [True, "3.4.0-f00dfeed00", "3.4.0"]
    said = [ln for ln in lines if ln.startswith("popdist:")]
    assert len(said) == 1 and "a real poptorch is installed" in said[0], done.stdout
    popart = run_job([sys.executable, "-c", "import popart"], env=env, timeout=120)
    assert popart.returncode != 0 and "No module named 'popart'" in popart.stdout


@pytest.mark.slow
@pytest.mark.parametrize("how", ["flag", "user's variable"])
def test_poprun_sets_it_for_every_instance(how: str) -> None:
    code = (
        "import json, popdist, poptorch, popdist_torch;"
        "print('INSTANCE', json.dumps([popdist.getInstanceIndex(), poptorch is popdist_torch,"
        " poptorch.ipuHardwareVersion(),"
        " [poptorch.ipuHardwareIsAvailable(n) for n in (1, 4, 5)]]))"
    )
    launch = ["--num-instances", "2", "--num-replicas", "2", "--ipus-per-replica", "2"]
    env = job_env()
    if how == "flag":
        launch.insert(0, "--poptorch-modules")
    else:
        env[VARIABLE] = "1"
    done = run_job(poprun_argv(*launch, sys.executable, "-c", code), env=env)
    assert done.returncode == 0, done.stdout
    found = sorted(
        json.loads(ln.split("INSTANCE ", 1)[1])
        for ln in done.stdout.splitlines()
        if "INSTANCE " in ln
    )
    # the run's devices: 2 replicas of 2 devices
    assert found == [[0, True, 2, [True, True, False]], [1, True, 2, [True, True, False]]]
