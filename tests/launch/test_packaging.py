"""Light imports, checked in a fresh interpreter: poprun and popdist never pull in torch,
Horovod or numpy when imported (poprun must start fast; a script pays for torch only when
it uses the executor)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import run_poprun

pytestmark = pytest.mark.launch


@pytest.mark.parametrize("module", ["popdist", "popdist.env", "poprun"])
def test_light_modules_do_not_import_torch_or_horovod(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'horovod', 'numpy'}); "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing {module} pulled in {out.stdout.strip()}"


def test_the_framework_imports_leave_their_heap_frozen() -> None:
    """``import popdist_torch`` (and ``popdist_lightning``) moves what torch's (Lightning's)
    imports built to the collector's permanent generation (popdist.heap): no later full
    collection, and not the interpreter's shutdown, walks it again."""
    code = "import gc, popdist_torch; print(gc.get_freeze_count())"
    if importlib.util.find_spec("lightning") is not None:
        code += "; import popdist_lightning; print(gc.get_freeze_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    counts = [int(n) for n in out.stdout.split()]
    assert counts[0] > 50_000, counts  # torch's modules, functions and operator overloads
    assert counts == sorted(set(counts)), counts  # Lightning's import added to it


def test_check_build_in_the_checkouts_environment() -> None:
    """``poprun --check-build`` here: Horovod built by the set-up, so auto takes it."""
    pytest.importorskip("horovod.torch", reason="Horovod is built by `make setup`")
    done = run_poprun("--check-build", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "        controllers:       [X] MPI [X] Gloo" in out
    assert "--backend auto takes: horovod (horovod.torch imports)" in out
    assert "mpi4py " in out and "built against: Open MPI" in out
    assert out.rstrip().endswith("poprun: a job can run here")


def test_auto_makes_one_choice_for_the_job_and_instance_0_says_it() -> None:
    pytest.importorskip("horovod.torch", reason="Horovod is built by `make setup`")
    code = "import popdist; popdist.init(); print('backend', popdist.collectives.active())"
    done = run_poprun("--num-instances", "2", "--num-replicas", "2", sys.executable, "-c", code,
                      timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split("\n"))[1:] == [
        "[1,0]<stdout>:backend horovod",
        "[1,1]<stdout>:backend horovod",
    ]
    notes = [line for line in done.stderr.splitlines() if "popdist: backend auto:" in line]
    assert notes == ["[1,0]<stderr>:popdist: backend auto: horovod, because horovod.torch imports"]


def test_one_instance_without_horovod_makes_the_whole_job_take_torch(tmp_path: Path) -> None:
    """The instances agree: Horovod hidden from instance 1 only (a package that fails to
    import, first on its PYTHONPATH) and both take torch; instance 0 names instance 1."""
    pytest.importorskip("horovod.torch", reason="Horovod is built by `make setup`")
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text('raise ImportError("not on this one")\n')
    code = "import popdist; popdist.init(); print('backend', popdist.collectives.active())"
    done = run_poprun(
        "--num-instances", "2", "--num-replicas", "2",
        "--instance-mpi-local-args", f"1:-x PYTHONPATH={tmp_path}",
        sys.executable, "-c", code, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split("\n"))[1:] == [
        "[1,0]<stdout>:backend torch",
        "[1,1]<stdout>:backend torch",
    ]
    assert (
        "[1,0]<stderr>:popdist: backend auto: torch, because horovod.torch does not import "
        "(ImportError: not on this one) on instance 1"
    ) in done.stderr.splitlines()
