"""The opt-in PopTorch module names, in this process: the finder, its metadata, the hook's line,
the hardware answers and ``poptorch._impl`` (issue 54).

Importing through the finder, a fresh interpreter with and without the variable, a real
PopTorch on the path and poprun's ``--poptorch-modules`` are in tests/launch/test_poptorch_modules.py.
"""

from __future__ import annotations

import builtins
import importlib.metadata
import io
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

import _popdist_poptorch as hook
import popdist_torch
from _popdist_poptorch import backend
from popdist import env
from popdist_torch.options import UnsupportedOptionError
from popdist_torch.surface import impl, rows_of
from popdist_torch.surface.toplevel import Error, ipuHardwareIsAvailable, ipuHardwareVersion
from tests.support.jobs import ROOT

pytestmark = pytest.mark.unit

POPRUN_ENV = {
    env.NUM_TOTAL_REPLICAS: "4",
    env.NUM_IPUS_PER_REPLICA: "2",
    env.NUM_LOCAL_REPLICAS: "2",
    env.UNIFORM_REPLICAS_PER_INSTANCE: "1",
    env.REPLICA_INDEX_OFFSET: "0",
    env.LOCAL_INSTANCE_INDEX: "0",
}


def _context(**kwargs: object) -> importlib.metadata.DistributionFinder.Context:
    return importlib.metadata.DistributionFinder.Context(**kwargs)


def test_the_variable_is_one_name_and_its_words_are_the_contracts() -> None:
    assert hook.VARIABLE == env.POPTORCH_MODULES
    assert env.POPTORCH_MODULES in env.USER_TUNING  # a user's own setting reaches the instances
    for value in ("1", "true", "YES", " on ", "0", "", "no", "off", "False"):
        assert hook.asked({hook.VARIABLE: value}) is env.read_poptorch_modules(
            {env.POPTORCH_MODULES: value}
        )
    assert hook.asked({}) is False


def test_a_bad_value_leaves_the_names_off_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert hook.asked({hook.VARIABLE: "maybe"}) is False
    assert "POPDIST_POPTORCH_MODULES='maybe' is not 1 or 0" in capsys.readouterr().err
    with pytest.raises(env.PopdistError, match="POPDIST_POPTORCH_MODULES"):
        env.read_poptorch_modules({env.POPTORCH_MODULES: "maybe"})


def test_the_pth_line_imports_nothing_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    line = hook.PTH_LINE
    assert line.startswith("import os;") and line.endswith("\n") and line.count("\n") == 1
    # It sorts after setuptools' editable .pth, which puts a checkout on sys.path first.
    assert hook.PTH_NAME > "__editable__.popdist_open-0.1.0.pth"
    imported: list[str] = []
    installs: list[bool] = []

    def spy(name: str, *args: object, **kwargs: object) -> object:
        imported.append(name)
        return __import__(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(hook, "install", lambda: installs.append(True))
    scope = {"__builtins__": {**vars(builtins), "__import__": spy}}
    monkeypatch.delenv(hook.VARIABLE, raising=False)
    exec(line, dict(scope))  # what site does with an "import" line of a .pth
    assert (imported, installs) == (["os"], [])
    monkeypatch.setenv(hook.VARIABLE, "1")
    exec(line, dict(scope))
    assert (imported, installs) == (["os", "os", "_popdist_poptorch"], [True])


def test_the_versions_are_poptorchs_forms_and_the_projects() -> None:
    from packaging.version import Version

    project = importlib.metadata.version("popdist-open")
    assert hook.VERSION == f"{hook.POPTORCH_API}-popdist.{project}" == popdist_torch.__version__
    assert Version(hook.METADATA_VERSION) >= Version("3.3")
    assert Version(hook.METADATA_VERSION).local == f"popdist.{project}"


def test_the_finder_answers_the_names_without_importing_them() -> None:
    finder = hook.Finder()
    spec = finder.find_spec("poptorch")
    assert spec is not None and spec.name == "poptorch" and spec.submodule_search_locations == []
    popart = finder.find_spec("popart")
    assert popart is not None and popart.submodule_search_locations is None
    assert finder.find_spec("numpy") is None and finder.find_spec("poptorchx") is None
    assert finder.find_spec("popart.anything") is None  # popart is a module, not a package
    # popdist_torch is imported here already: submodules resolve to the project's
    optim = finder.find_spec("poptorch.optim")
    assert optim is not None and optim.submodule_search_locations is not None
    assert finder.find_spec("poptorch.not_a_module") is None
    for name, target in hook.MODULES.items():
        found = finder.find_spec(name)
        assert found is not None, name
        assert found.loader.target == target  # type: ignore[union-attr]


def test_the_alias_loader_gives_the_projects_module_and_keeps_its_spec() -> None:
    loader = hook._Alias("popdist_torch.optim")
    spec = hook.Finder().find_spec("poptorch.optim")
    assert spec is not None
    module = loader.create_module(spec)
    assert module is popdist_torch.optim
    own = module.__spec__
    module.__spec__ = spec  # what the import system does between the two calls
    loader.exec_module(module)
    assert module.__spec__ is own and own is not None and own.name == "popdist_torch.optim"


def test_the_metadata_answers_by_name_only() -> None:
    finder = hook.Finder()
    (dist,) = finder.find_distributions(_context(name="poptorch"))
    assert dist.metadata["Name"] == "poptorch"
    assert dist.version == hook.METADATA_VERSION
    assert dist.files is None  # no RECORD: pip has nothing to list or uninstall
    assert list(finder.find_distributions(_context(name="PopTorch"))) != []
    assert list(finder.find_distributions(_context())) == []  # listing every distribution
    assert list(finder.find_distributions(_context(name="poptorch", path=["/x"]))) == []
    assert list(finder.find_distributions(_context(name="popart"))) == []
    assert list(finder.find_distributions(_context(name="torch"))) == []


def _fake_poptorch(root: Path) -> Path:
    package = root / "poptorch"
    package.mkdir()
    (package / "__init__.py").write_text("__version__ = '3.4.0-real'\n")
    return package


def test_a_real_poptorch_on_the_path_wins_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_poptorch(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = hook.Finder()
    assert finder.find_spec("poptorch") is None
    assert finder.find_spec("popart") is None
    assert finder.find_spec("poptorch.optim") is None
    assert list(finder.find_distributions(_context(name="poptorch"))) == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "a real poptorch is installed" in err and str(tmp_path) in err


def test_install_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hook.VARIABLE, raising=False)
    assert hook.install() is None
    before = list(sys.meta_path)
    monkeypatch.setenv(hook.VARIABLE, "1")
    monkeypatch.setattr(hook, "_finder", None)
    try:
        finder = hook.install()
        assert finder is not None and sys.meta_path[0] is finder and hook.installed()
        assert hook.install() is finder and sys.meta_path.count(finder) == 1  # idempotent
    finally:
        sys.meta_path[:] = before
    assert not hook.installed()


def test_the_backend_adds_the_pth_and_its_record_line(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo/__init__.py", "")
        archive.writestr("demo-1.0.dist-info/METADATA", "Name: demo\n")
        archive.writestr("demo-1.0.dist-info/RECORD", "demo/__init__.py,,\nRECORD,,\n")
    backend.add_pth(str(wheel))
    backend.add_pth(str(wheel))  # a second pass replaces, never duplicates
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        record = archive.read("demo-1.0.dist-info/RECORD").decode().splitlines()
        line = archive.read(hook.PTH_NAME).decode()
    assert names.count(hook.PTH_NAME) == 1 and line == hook.PTH_LINE
    (entry,) = [r for r in record if r.startswith(hook.PTH_NAME)]
    assert entry.endswith(f",{len(hook.PTH_LINE)}") and "sha256=" in entry
    assert "demo/__init__.py,," in record


def test_pyproject_builds_with_the_backend() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'build-backend = "_popdist_poptorch.backend"' in text
    assert 'name = "poptorch"' not in text and 'name = "popart"' not in text


def test_hardware_answers_off_and_under_the_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (env.POPTORCH_MODULES, *POPRUN_ENV, env.NUM_INSTANCES):
        monkeypatch.delenv(name, raising=False)
    assert ipuHardwareIsAvailable() is False
    with pytest.raises(UnsupportedOptionError, match="ipuHardwareIsAvailable"):
        ipuHardwareVersion()
    monkeypatch.setenv(env.POPTORCH_MODULES, "1")
    assert ipuHardwareVersion() == 2
    # a process poprun did not launch is its own run: any count
    assert ipuHardwareIsAvailable() and ipuHardwareIsAvailable(16)
    assert not ipuHardwareIsAvailable(0) and not ipuHardwareIsAvailable(True)
    for name, value in POPRUN_ENV.items():  # 4 replicas of 2 devices
        monkeypatch.setenv(name, value)
    assert [ipuHardwareIsAvailable(n) for n in (1, 8, 9)] == [True, True, False]
    monkeypatch.setenv(env.POPTORCH_MODULES, "0")
    assert ipuHardwareIsAvailable(1) is False


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.register_buffer("steps", torch.zeros(()))


def test_impl_is_poptorchs_private_module_with_nothing_wrapped() -> None:
    names = {row.name for row in rows_of("poptorch._impl")}
    assert names <= set(impl.__all__)
    assert {"rewrapModelIfNecessary", "unwrapModelIfNecessary", "unwrapIfWrapped"} <= names
    model = _Net()
    wrapped = popdist_torch.trainingModel(model)
    assert type(model) is _Net and not impl.isWrapped(model) and not impl.isWrapped(wrapped)
    assert impl.unwrapIfWrapped(model) is model
    impl.unwrapModelIfNecessary(model)
    impl.rewrapModelIfNecessary(model)
    assert type(model) is _Net and all(type(p) is nn.Parameter for p in model.parameters())
    seen: list[str] = []
    impl.forEachParameterAndBuffer(model, lambda name, _: seen.append(name))
    assert seen == ["steps", "fc.weight", "fc.bias"]
    error = impl.createPoptorchError("boom")
    assert isinstance(error, Error) and isinstance(error, RuntimeError)
    assert (error.type, error.message, str(error)) == (  # type: ignore[attr-defined]
        "poptorch_py_error",
        "boom",
        "'poptorch_py_error': boom",
    )
    assert impl.isRunningOnIpu() is False


def test_the_names_page_lists_the_modules() -> None:
    page = (ROOT / "docs" / "poptorch-names.md").read_text()
    for name, target in hook.MODULES.items():
        assert f"- `{name}`: `{target}`" in page
    assert hook.METADATA_VERSION in page and hook.VERSION in page


def test_stderr_is_written_once_per_finder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_poptorch(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    finder = hook.Finder()
    for _ in range(3):
        finder.find_spec("poptorch")
    assert err.getvalue().count("popdist:") == 1


def test_a_folder_named_poptorch_is_no_real_poptorch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "poptorch").mkdir()  # data, or a namespace portion: nothing to import
    monkeypatch.syspath_prepend(str(tmp_path))
    assert hook.real_install("poptorch") is None
    assert hook.Finder().find_spec("poptorch") is not None
