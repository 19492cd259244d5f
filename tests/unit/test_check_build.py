"""``poprun --check-build``'s report (pure: given the interpreter's probe and poprun's view)."""

from __future__ import annotations

import pytest

from popdist.installation import missing_by_feature
from poprun.check_build import render

pytestmark = pytest.mark.unit

HOST = {
    "mpirun": "/usr/bin/mpirun",
    "mpirun_version": "mpirun (Open MPI) 4.1.4",
    "cluster": None,
    "ssh": "/usr/bin/ssh",
    "ssh_version": "OpenSSH_9.2p1",
    "fabric": [],
}
TORCH = {"version": "2.13.0+cpu", "distributed": True, "gloo": True, "mpi": False,
         "nccl": False, "cuda": None, "gpus": []}  # fmt: skip
NO_HOROVOD = "ModuleNotFoundError: No module named 'horovod'"


def _probe(**changes: object) -> dict[str, object]:
    probe: dict[str, object] = {
        "python": "3.11.7",
        "executable": "/v/bin/python",
        "popdist": "0.1.0",
        "torch": TORCH,
        "mpi4py": {"version": "4.1.2", "library": "Open MPI v4.1.4"},
        "horovod": {"error": NO_HOROVOD},
        "auto": {"choice": "torch", "reason": "horovod.torch does not import (...)"},
        "missing": {"horovod (the horovod backend)": ["horovod"]},
    }
    return probe | changes


def test_without_horovod_a_job_can_run_on_the_torch_backend() -> None:
    lines, problems = render(_probe(), HOST)
    text = "\n".join(lines)
    assert problems == []
    assert f"[ ] horovod: {NO_HOROVOD}" in text
    assert "[X] torch.distributed: [X] gloo [ ] MPI [ ] NCCL" in text
    assert "--backend auto takes: torch" in text
    assert "horovod (the horovod backend): missing horovod" in text
    assert "Cluster: none around poprun" in text and "GPUs torch sees: none" in text
    assert "fabric: none (jobs across hosts, this one among them, take Open MPI's TCP path)" in text
    lines, _ = render(_probe(), HOST | {"fabric": ["mlx5_0", "mlx5_1"]})
    assert "fabric: mlx5_0, mlx5_1 (Open MPI picks it for jobs across hosts)" in lines


def test_horovod_shows_its_controllers_and_tensor_operations() -> None:
    horovod = {
        "version": "0.28.1",
        "controllers": {"MPI": True, "Gloo": True},
        "operations": {"NCCL": False, "DDL": False, "CCL": False, "MPI": True, "Gloo": True},
    }
    job = "Slurm allocation: job 7, nodes n[1-2] (SLURM_JOB_NODELIST), ..."
    lines, _ = render(_probe(horovod=horovod), HOST | {"cluster": job})
    assert "        controllers:       [X] MPI [X] Gloo" in lines
    assert "        tensor operations: [ ] NCCL [ ] DDL [ ] CCL [X] MPI [X] Gloo" in lines
    assert f"Cluster: {job}" in lines


def test_no_mpirun_or_no_backend_means_no_job() -> None:
    _, problems = render(_probe(auto={"choice": None, "reason": "none"}), HOST | {"mpirun": None})
    assert any("mpirun is not on PATH" in p for p in problems)
    assert "no collectives backend can start" in problems
    _, problems = render({"error": "boom"}, HOST)
    assert problems == ["the interpreter's probe failed (boom)"]


def test_missing_packages_are_listed_per_feature_from_the_extras() -> None:
    requires = [
        "torch>=2.1",
        'scikit-learn>=1.3; extra == "examples"',
        'lightning<2.7,>=2.4; extra == "lightning"',
        'pytest>=8; extra == "dev"',
    ]
    installed = {"scikit-learn": "1.5"}.get
    assert missing_by_feature(requires, installed) == {
        "examples (pip extra [examples])": [],
        "lightning (pip extra [lightning])": ["lightning"],
        "horovod (the horovod backend)": ["horovod"],
    }
