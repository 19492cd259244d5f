"""popdist's collectives: the registry, declared capabilities, the null backend, the life cycle."""

from __future__ import annotations

import ast
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import popdist
from popdist import collectives, env
from popdist.collectives import LOCAL, REGISTRY, CollectiveError, lifecycle, mpilane
from popdist.collectives.local import LocalCollectives
from popdist.collectives.registry import AUTO, PREFERENCE, BackendSpec, Capabilities
from popdist_torch.execution.reducer import broadcast_state, connect
from tests.support.jobs import ROOT

pytestmark = pytest.mark.unit

HEAVY = ("torch", "horovod", "numpy", "mpi4py")


@pytest.fixture(autouse=True)
def _one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-process environment and a fresh life cycle (no backend of another test)."""
    for name in (*env.ALL, env.OMPI_SIZE, env.OMPI_RANK, env.OMPI_LOCAL_RANK, env.OMPI_LOCAL_SIZE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(lifecycle._Run, "objects", {})
    monkeypatch.setattr(lifecycle._Run, "started", None)
    monkeypatch.setattr(lifecycle._Run, "spent", False)
    monkeypatch.setattr(lifecycle._Run, "auto", None)
    monkeypatch.setattr(lifecycle._Run, "atexit_registered", True)


# -- the registry --------------------------------------------------------------------------------
def _eager_imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it is imported (not in functions, not for typing)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) or (
            isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        ):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Import):
                found |= {alias.name for alias in sub.names}
            elif isinstance(sub, ast.ImportFrom) and sub.module and not sub.level:
                found.add(sub.module)
                found |= {f"{sub.module}.{alias.name}" for alias in sub.names}
    return found


def _eager_closure(module: str) -> set[str]:
    """Every module ``import module`` runs, following the project's own modules."""
    seen: set[str] = {module}
    visited: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        path = ROOT / Path(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if name in visited or not path.is_file():
            continue
        visited.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages
        for imported in _eager_imports(path):
            seen.add(imported)
            if imported.split(".")[0] == "popdist":
                todo.append(imported)
    return seen


def test_import_popdist_imports_no_backend_module_nor_heavy_library() -> None:
    # ``popdist.init`` (first use) imports popdist.collectives: its closure counts too
    reached = _eager_closure("popdist") | _eager_closure("popdist.collectives")
    assert "popdist.collectives.registry" in reached and "popdist.collectives.lifecycle" in reached
    assert {m for m in reached if m.split(".")[0] in HEAVY} == set()
    backends = {"base", "horovod", "torchdist", "mpilane", "local"}
    assert {m for m in reached if m.rpartition(".")[2] in backends} == set()


def test_import_popdist_alone_imports_no_thread_signal_or_functools() -> None:
    """Outside poprun ``import popdist`` stays a few modules: the collectives, the notice,
    progress and the lease come on first use or when poprun's variables ask for them."""
    reached = _eager_closure("popdist")
    assert {"popdist.env", "popdist.context", "popdist.instances"} <= reached
    assert {"threading", "signal", "functools", "popdist.collectives"} & reached == set()


def test_reading_capabilities_imports_no_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("popdist.collectives.horovod", "popdist.collectives.torchdist", "horovod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setenv(env.BACKEND, "horovod")  # named: auto would probe the backends
    assert not collectives.capabilities(2).restartable
    monkeypatch.setenv(env.BACKEND, "torch")
    assert collectives.capabilities(2).reduces_on("cuda")
    assert "popdist.collectives.horovod" not in sys.modules
    assert "popdist.collectives.torchdist" not in sys.modules


def test_a_factory_imports_the_backends_module_not_its_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "horovod", None)  # importing Horovod would fail
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    backend = REGISTRY["horovod"].create()
    assert backend.name == "horovod" and not backend.is_started()


def test_every_choosable_backend_is_registered_and_named_alike() -> None:
    assert set(env.BACKENDS) - {AUTO} | {LOCAL} == set(REGISTRY)
    assert env.BACKENDS[0] == AUTO and set(PREFERENCE) == set(env.BACKENDS) - {AUTO}
    for name, spec in REGISTRY.items():
        created = spec.create()
        assert (spec.name, created.name) == (name, name)
        assert created.capabilities is spec.capabilities


def test_an_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(CollectiveError, match=r"'nccl' is unknown: expected one of \['horovod', "):
        collectives.spec("nccl")


# -- capabilities ---------------------------------------------------------------------------------
def test_declared_capabilities() -> None:
    horovod, torch_, local = (REGISTRY[n].capabilities for n in ("horovod", "torch", LOCAL))
    assert horovod.reduces_on("cpu") and not horovod.reduces_on("cuda")  # no GPU collectives
    assert torch_.reduces_on("cpu") and torch_.reduces_on("cuda")
    assert local.reduces_on("cuda") and local.reduces_on("meta")  # it moves nothing
    assert not horovod.restartable and torch_.restartable and local.restartable
    assert horovod.asynchronous and torch_.asynchronous and not local.asynchronous
    assert horovod.communicates and torch_.communicates and not local.communicates
    assert all(spec.capabilities.broadcasts_objects for spec in REGISTRY.values())
    assert Capabilities(frozenset({"cpu"})) == Capabilities(frozenset({"cpu"}), restartable=True)


# -- the null backend -------------------------------------------------------------------------------
def test_the_local_backend_keeps_every_input() -> None:
    local = LocalCollectives()
    local.start()
    assert (local.rank(), local.size(), local.is_started()) == (0, 1, True)
    t = torch.tensor([1, 2, 3])
    assert local.allreduce_(t, average=True) is t and t.tolist() == [1, 2, 3]
    local.wait(local.allreduce_async_(t, average=True))
    assert t.tolist() == [1, 2, 3]
    assert local.broadcast_(t, root=0) is t
    gathered = local.allgather(t.unsqueeze(0))
    assert gathered.shape == (1, 3) and gathered.tolist() == [[1, 2, 3]]  # the one-element stack
    local.barrier()
    obj = {"a": [1]}
    assert local.broadcast_object(obj) is obj
    local.shutdown()
    assert local.is_started()  # nothing to stop


def test_the_wrap_time_broadcast_on_the_local_backend_changes_nothing() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    before = (model.weight.clone(), dict(opt.state_dict()["state"][0]))
    broadcast_state(LocalCollectives(), model, opt, buffers=True)
    assert torch.equal(model.weight, before[0])
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], before[1]["exp_avg"])


# -- one place chooses the local backend ---------------------------------------------------------------
def test_one_instance_gets_the_local_backend_and_starts_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "horovod.torch", None)  # starting Horovod would fail
    assert collectives.for_run().name == LOCAL
    assert collectives.for_run(1) is collectives.for_run()
    assert connect(1, 0).name == LOCAL
    assert collectives.capabilities().reduces_on("cuda")
    assert popdist.execute_on_instances({0}, lambda: 5) == 5
    assert not popdist.isBackendInitialized()
    assert collectives.active() == "torch"  # what an explicit init() would start: auto, no Horovod


def test_a_world_of_one_inside_a_larger_run_is_local_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Options.Distributed.disable()`` under poprun: the executor asks for one process."""
    monkeypatch.setenv(env.OMPI_SIZE, "2")
    monkeypatch.setenv(env.OMPI_RANK, "1")
    assert connect(1, 0).name == LOCAL
    assert not popdist.isBackendInitialized()


class FakeHorovod(LocalCollectives):
    """Stands in for Horovod: a world of one that can be started and shut down, once."""

    name = "horovod"
    label = "Fake Horovod"

    def __init__(self) -> None:
        self.started = False

    def start(self) -> None:
        self.started = True

    def is_started(self) -> bool:
        return self.started

    def shutdown(self) -> None:
        self.started = False


def _fake_horovod(monkeypatch: pytest.MonkeyPatch, **capabilities: Any) -> None:
    spec = BackendSpec(
        "horovod",
        f"{__name__}:FakeHorovod",
        Capabilities(frozenset({"cpu"}), **capabilities),
    )
    monkeypatch.setitem(REGISTRY, "horovod", spec)
    monkeypatch.setenv(env.BACKEND, "horovod")  # named: auto would ask the other ranks over MPI


def test_an_explicit_init_in_one_process_still_starts_the_chosen_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_horovod(monkeypatch, restartable=False)
    popdist.init()
    assert popdist.isBackendInitialized() and collectives.active() == "horovod"
    assert collectives.for_run().name == LOCAL  # the project's own collectives stay local
    popdist.finalizeBackend()
    assert not popdist.isBackendInitialized()
    with pytest.raises(popdist.PopdistError, match=r"cannot be started twice"):
        popdist.init()  # not restartable, as declared


def test_started_is_the_chosen_backend_even_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A script's own collectives after popdist.init() (scripts/gpu_check.py) get the backend."""
    _fake_horovod(monkeypatch, restartable=True)
    assert collectives.started().name == "horovod"  # started on demand
    assert popdist.isBackendInitialized() and collectives.for_run().name == LOCAL
    popdist.finalizeBackend()


def test_a_restartable_backend_starts_again_after_finalize(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_horovod(monkeypatch, restartable=True)
    popdist.init()
    popdist.finalizeBackend()
    popdist.init()
    assert popdist.isBackendInitialized()
    popdist.finalizeBackend()


def test_a_backend_whose_world_is_not_the_run_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_horovod(monkeypatch)
    monkeypatch.setenv(env.OMPI_SIZE, "2")
    monkeypatch.setenv(env.OMPI_RANK, "1")
    with pytest.raises(CollectiveError, match=r"Fake Horovod sees rank 0 of 1 .* instance 1 of 2"):
        popdist.init()
    assert not popdist.isBackendInitialized()
    assert not lifecycle._Run.objects["horovod"].is_started()


# -- MPI_THREAD_MULTIPLE ---------------------------------------------------------------------------------
class FakeMPI:
    """``mpi4py.MPI`` with a started world of two ranks, granting ``granted``."""

    THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = range(4)
    FLOAT, DOUBLE, INT32_T, INT64_T = "float32", "float64", "int32", "int64"

    def __init__(self, granted: int) -> None:
        self.granted = granted
        self.COMM_WORLD = self

    def Query_thread(self) -> int:
        return self.granted

    def Is_initialized(self) -> bool:
        return True

    def Is_finalized(self) -> bool:
        return False

    def Get_size(self) -> int:
        return 2

    def Dup(self) -> FakeMPI:
        return self


@pytest.mark.parametrize("granted", range(3))
def test_without_thread_multiple_there_is_no_lane_and_one_warning(
    monkeypatch: pytest.MonkeyPatch, granted: int
) -> None:
    monkeypatch.setattr(mpilane, "_warned", False)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", FakeMPI(granted))
    with pytest.warns(RuntimeWarning, match=rf"thread level {granted}, not MPI_THREAD_MULTIPLE"):
        assert mpilane.MpiLane.for_world() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert mpilane.MpiLane.for_world() is None


def test_with_thread_multiple_the_lane_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    mpi = FakeMPI(FakeMPI.THREAD_MULTIPLE)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mpilane.threads_allowed(mpi)
        lane = mpilane.MpiLane.for_world()
    assert isinstance(lane, mpilane.MpiLane)


def test_gpu_check_keeps_the_users_mca_settings_and_drops_job_marks() -> None:
    """On a GPU box without ssh, ``OMPI_MCA_plm=isolated`` is what lets mpirun start: the
    script's launches keep it (it dropped every ``OMPI_*`` once, and mpirun looked for ssh)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    environ = {
        "OMPI_MCA_plm": "isolated", "PMIX_MCA_gds": "hash", "PATH": "/bin",
        "OMPI_COMM_WORLD_RANK": "0", "PMIX_RANK": "0", "POPDIST_NUM_INSTANCES": "2",
    }  # fmt: skip
    assert gpu_check.job_free_env(environ) == {
        "OMPI_MCA_plm": "isolated",
        "PMIX_MCA_gds": "hash",
        "PATH": "/bin",
    }
