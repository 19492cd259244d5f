"""``auto``, the default backend: the first of Horovod and torch every instance can run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import popdist
from popdist import collectives, env
from popdist.collectives import CollectiveError, auto, lifecycle
from popdist.collectives.horovod import install_hint
from popdist.env import read_backend

pytestmark = pytest.mark.unit

NO_HOROVOD = "horovod.torch does not import (ModuleNotFoundError: No module named 'horovod')"


@pytest.fixture(autouse=True)
def _one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*env.ALL, env.OMPI_SIZE, env.OMPI_RANK, env.OMPI_LOCAL_RANK, env.OMPI_LOCAL_SIZE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(lifecycle._Run, "objects", {})
    monkeypatch.setattr(lifecycle._Run, "started", None)
    monkeypatch.setattr(lifecycle._Run, "auto", None)


def test_auto_is_the_default_and_a_choice_like_the_others() -> None:
    assert read_backend({}) == "auto"
    assert read_backend({env.BACKEND: " AUTO "}) == "auto"
    assert read_backend({env.BACKEND: "horovod"}, requested="auto") == "auto"


def test_horovod_is_taken_when_it_runs_on_every_instance() -> None:
    choice = auto.decide([{"horovod": None, "torch": None}] * 2)
    assert choice == auto.Choice("horovod", "horovod.torch imports")
    assert choice.note() == "popdist: backend auto: horovod, because horovod.torch imports"


def test_torch_is_taken_when_horovod_is_missing_and_the_note_says_why() -> None:
    choice = auto.decide([{"horovod": NO_HOROVOD, "torch": None}])
    assert choice.name == "torch"
    assert choice.note() == f"popdist: backend auto: torch, because {NO_HOROVOD}"
    assert "\n" not in choice.note()


def test_one_instance_without_horovod_makes_every_instance_take_torch() -> None:
    """The same choice on every instance: the probes are decided together, not each alone."""
    probes = [{"horovod": None, "torch": None}, {"horovod": NO_HOROVOD, "torch": None}]
    choice = auto.decide(probes)
    assert choice.name == "torch" and choice.reason == f"{NO_HOROVOD} on instance 1"


def test_no_backend_at_all_is_an_error_naming_each_reason() -> None:
    probes = [{"horovod": NO_HOROVOD, "torch": "mpi4py does not import (x)"}]
    with pytest.raises(
        CollectiveError, match=r"no collectives backend runs .*No module named 'horovod'.*mpi4py"
    ):
        auto.decide(probes)


def test_one_process_resolves_alone_and_says_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "horovod.torch", None)  # importing it fails
    assert collectives.active() == "torch"
    assert collectives.active() == "torch"  # decided once
    err = capsys.readouterr().err
    assert err.count("popdist: backend auto: torch, because horovod.torch does not import") == 1


def test_instance_1_chooses_silently(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    run = env.read_run({env.OMPI_SIZE: "1", env.OMPI_RANK: "0"}).replace(instance_index=1)
    assert auto.choose(run).name == "torch"
    assert capsys.readouterr().err == ""


def test_an_explicit_horovod_without_horovod_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    with pytest.raises(CollectiveError) as info:
        popdist.init(backend="horovod")
    message = str(info.value)
    assert "horovod.torch" in message and "--backend torch" in message
    assert "make" not in message.replace("cmake", "")  # this checkout: its set-up script
    assert "scripts/setup.sh" in message
    assert not popdist.isBackendInitialized()


def test_a_pip_install_is_told_to_build_horovod_with_pip_never_make(tmp_path: Path) -> None:
    hint = install_hint(tmp_path)  # a site-packages: no scripts/setup.sh beside the package
    assert "pip install" in hint and "horovod" in hint and "--backend torch" in hint
    assert "make" not in hint.replace("cmake", "")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "setup.sh").write_text("")
    assert f"bash {tmp_path / 'scripts' / 'setup.sh'}" in install_hint(tmp_path)
