"""PopTorch programs with their own imports, under the opt-in (issue 54).

The seed documents' listings (``tests/seeds/listing_*.py``) are kept with one change, their
``import poptorch`` written ``import popdist_torch as poptorch`` (tests/seeds/README.md); here
each is read from its file as it is, given its original import back, and launched as its
document launches it (``python``, ``mpirun``, ``poprun``) with ``POPDIST_POPTORCH_MODULES=1``
or ``poprun --poptorch-modules``. The same for ``examples/``: their ``import popdist_torch as
poptorch`` becomes ``import poptorch`` (the project's own names, such as
``popdist_torch.checkpoint``, keep their imports). Nothing else of the source changes.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.support.jobs import MPIRUN, ROOT, job_env, mpirun_argv, run_job

pytestmark = [pytest.mark.launch, pytest.mark.slow]

SEEDS = ROOT / "tests" / "seeds"
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent
STAND_IN = "import popdist_torch as poptorch"
ORIGINAL = "import poptorch"


def original(source: Path, into: Path) -> Path:
    """``source`` as its users wrote it: the stand-in import line back to ``import poptorch``."""
    text = source.read_text()
    lines = text.splitlines(keepends=True)
    changed = [ORIGINAL + "\n" if ln.rstrip("\n") == STAND_IN else ln for ln in lines]
    assert changed != lines, f"{source.name} has no `{STAND_IN}` line to give back"
    assert ORIGINAL + "\n" in changed
    out = into / source.name
    out.write_text("".join(changed))
    return out


def user_env(*, opt_in: bool = True, path: Path | None = None) -> dict[str, str]:
    """A user's shell with the project's environment active, asking for the names."""
    env = job_env()
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    if path is not None:
        env["PYTHONPATH"] = f"{path}{os.pathsep}{env['PYTHONPATH']}"
    if opt_in:
        env["POPDIST_POPTORCH_MODULES"] = "1"
    return env


def poprun(*args: str) -> list[str]:
    return [str(BIN / "poprun"), "--poptorch-modules", *args]


def _ok(done: object) -> str:
    out = getattr(done, "stdout", "")
    assert getattr(done, "returncode", 1) == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    return str(out)


# -- the seeds' listings ------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_the_pipelining_tutorial_with_import_poptorch(tmp_path: Path) -> None:
    script = original(SEEDS / "listing_pipelining_tutorial.py", tmp_path)
    # digits_as_mnist (the listing's torchvision) stays where the seeds keep it
    done = run_job(["python", str(script)], env=user_env(path=SEEDS), timeout=580)
    out = _ok(done)
    match = re.search(r"Accuracy on test set: ([0-9.]+)%", out)
    assert match and float(match.group(1)) >= 75.0, out[-4000:]


@pytest.mark.skipif(MPIRUN is None, reason="needs mpirun")
def test_distributed_without_poprun_with_import_poptorch(tmp_path: Path) -> None:
    script = original(SEEDS / "listing_distributed_without_poprun.py", tmp_path)
    done = run_job(
        mpirun_argv(2, "--tag-output", "python", str(script)), env=user_env(), timeout=300
    )
    out = _ok(done)
    for rank in (0, 1):
        calls = re.findall(rf"\[1,{rank}\]<stdout>:(\d+) (?:tensor\()?\d+\)?, tensor", out)
        assert calls == ["0", "1", "2"], out[-4000:]


def test_the_popdist_example_with_import_poptorch(tmp_path: Path) -> None:
    script = original(SEEDS / "listing_popdist_pytorch_example.py", tmp_path)
    cmd = poprun("--num-replicas=4", "--num-instances=2", "python", str(script), "--replicas", "3")
    out = _ok(run_job(cmd, env=user_env(opt_in=False)))
    assert out.count("The number of replicas is overridden by PopRun. The new value is 4.") == 2


def test_the_horovod_check_with_import_poptorch(tmp_path: Path) -> None:
    script = original(SEEDS / "listing_popdist_horovod_check.py", tmp_path)
    cmd = poprun("--num-replicas=2", "--num-instances=2", "python", str(script))
    _ok(run_job(cmd, env=user_env(opt_in=False)))


# -- examples/ ---------------------------------------------------------------------------


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    """Every example with a stand-in import, its original import back, side by side (one
    example imports another)."""
    for source in sorted(EXAMPLES.glob("*.py")):
        if STAND_IN in source.read_text().splitlines():
            original(source, tmp_path)
    return tmp_path


def test_train_digits_with_import_poptorch(examples: Path) -> None:
    cmd = poprun("--num-instances", "2", "--num-replicas", "4", "python")
    done = run_job(
        [*cmd, str(examples / "train_digits.py"), "--epochs", "3"], env=user_env(opt_in=False)
    )
    out = _ok(done)
    assert "weights identical on every instance" in out
    assert re.search(r"global test accuracy [0-9.]+ \(\d+/450 samples, 2 instance", out), out


@pytest.mark.skipif(MPIRUN is None, reason="needs mpirun")
def test_distributed_example_with_import_poptorch(examples: Path) -> None:
    script = str(examples / "distributed_without_poprun.py")
    out = _ok(run_job(mpirun_argv(2, "python", script), env=user_env(), timeout=300))
    for pid in (0, 1):
        assert f"process {pid}: call 0, combined batch (160, 3, 2), output (4, 2)" in out


def test_popdist_horovod_with_import_poptorch(examples: Path) -> None:
    cmd = poprun("--num-instances", "2", "--num-replicas", "4", "python")
    script = str(examples / "popdist_horovod.py")
    _ok(run_job([*cmd, script, "--replicas", "4", "--steps", "5"], env=user_env(opt_in=False)))


def test_mnist_pipeline_with_import_poptorch(examples: Path) -> None:
    script = str(examples / "mnist_pipeline.py")
    out = _ok(run_job(["python", script, "--epochs", "1"], env=user_env()))
    assert "Accuracy on test set" in out


def test_slurm_train_outside_slurm_with_import_poptorch(examples: Path) -> None:
    # it imports train_digits from its own folder: the one given its original import too
    cmd = poprun("--num-instances", "2", "--num-replicas", "2", "python")
    script = str(examples / "slurm_train.py")
    args = ["--steps", "20", "--save-every", "10", "--checkpoint", str(examples / "digits.pt")]
    _ok(run_job([*cmd, script, *args], env=user_env(opt_in=False)))
