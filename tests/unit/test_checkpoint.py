"""Checkpoints: round trip, weights-only loading, file modes (atomicity under SIGKILL: tests/parallel)."""

from __future__ import annotations

import os
import pickle
import random
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from popdist_torch import optim
from popdist_torch.checkpoint import (
    CheckpointError,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from popdist_torch.data import DataLoader
from popdist_torch.options import Options
from tests.support.data import net

pytestmark = pytest.mark.unit


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    opt.zero_grad()
    x = batch.float().unsqueeze(1).repeat(1, 3) / 10 + torch.randn(len(batch), 3) * 0.01
    model(x).pow(2).mean().backward()
    opt.step()


def test_round_trip_continues_identically(tmp_path: Path) -> None:
    """N steps, save, M steps == N steps, load into fresh objects, M steps."""
    data = torch.utils.data.TensorDataset(torch.arange(40))

    def setup() -> tuple[torch.nn.Module, torch.optim.Optimizer, DataLoader]:
        torch.manual_seed(5)
        model = net()
        opt = optim.Adam(model.parameters(), lr=0.05)
        loader = DataLoader(Options().randomSeed(9), data, batch_size=4, shuffle=True)
        return model, opt, loader

    def run(model: torch.nn.Module, opt: torch.optim.Optimizer, it: Iterator, steps: int) -> None:
        for _ in range(steps):
            train_step(model, opt, next(it)[0])

    model, opt, loader = setup()
    it = iter(loader)
    run(model, opt, it, 4)
    save_checkpoint(
        tmp_path / "c.pt",
        model=model,
        optimizer=opt,
        step=4,
        dataloader=loader,
        extra={"note": "x"},
    )
    run(model, opt, it, 5)
    reference = [p.detach().clone() for p in model.parameters()]

    random.random(), np.random.rand(), torch.rand(3)  # disturb every generator
    model, opt, loader = setup()
    state = load_checkpoint(tmp_path / "c.pt", model=model, optimizer=opt, dataloader=loader)
    assert state["step"] == 4 and state["extra"] == {"note": "x"}
    run(model, opt, iter(loader), 5)
    for p, q in zip(model.parameters(), reference, strict=True):
        assert torch.equal(p, q)


def test_rng_states_are_restored(tmp_path: Path) -> None:
    model = net()
    save_checkpoint(tmp_path / "c.pt", model=model)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    load_checkpoint(tmp_path / "c.pt", model=model)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
    load_checkpoint(tmp_path / "c.pt", model=model, restore_rng=False)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) != expected


@pytest.mark.parametrize(
    ("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o000, 0o664), (0o002, 0o664)]
)
def test_file_mode_honours_umask_and_is_never_world_writable(
    tmp_path: Path, umask: int, mode: int
) -> None:
    previous = os.umask(umask)
    try:
        save_checkpoint(tmp_path / "c.pt", model=net())
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "c.pt").stat().st_mode) == mode


class Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pwned",))


def test_loading_is_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    with open(path, "wb") as stream:
        pickle.dump(
            {"format": "popdist_torch.checkpoint/1", "model": Payload()}, stream, protocol=2
        )
    with pytest.raises(CheckpointError, match="weights_only=True"):
        load_checkpoint(path, model=net())


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt", model=net())
    torch.save({"weights": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a popdist_torch checkpoint"):
        load_checkpoint(tmp_path / "other.pt", model=net())
    with pytest.raises(ValueError, match="step=-1 is invalid"):
        save_checkpoint(tmp_path / "c.pt", model=net(), step=-1)
    with pytest.raises(CheckpointError, match="does not exist"):
        save_checkpoint(tmp_path / "no" / "c.pt", model=net())
    save_checkpoint(tmp_path / "c.pt", model=net())
    with pytest.raises(CheckpointError, match="no optimizer state"):
        model = net()
        load_checkpoint(tmp_path / "c.pt", model=model, optimizer=optim.SGD(model.parameters()))


def _damage(path: Path, needle: bytes, how: str) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at > 0, "the weights' bytes are stored as they are"
    if how == "flip":
        data[at + 1] ^= 0x04
    else:
        data[at : at + len(needle)] = bytes(len(needle))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flip", "zero"])
def test_damaged_weights_are_refused_not_loaded(tmp_path: Path, how: str) -> None:
    model = net()
    with torch.no_grad():
        model[0].weight.fill_(1.2345)
    save_checkpoint(tmp_path / "c.pt", model=model)
    _damage(tmp_path / "c.pt", torch.full((15,), 1.2345).numpy().tobytes(), how)
    fresh = net()
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(CheckpointError, match="damaged"):
        load_checkpoint(tmp_path / "c.pt", model=fresh)
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())


def test_extra_with_numpy_paths_namespaces_and_dates_round_trips(tmp_path: Path) -> None:
    import argparse
    import datetime

    extra = {
        "scalar": np.float32(0.5),
        "count": np.int64(7),
        "array": np.arange(6, dtype=np.int16).reshape(2, 3),
        "path": Path("/data/run1"),
        "args": argparse.Namespace(lr=0.1, name="x", out=Path("o")),
        "when": datetime.datetime(2026, 11, 23, 21, 0, 5, tzinfo=datetime.UTC),
        "day": datetime.date(2026, 1, 2),
        "took": datetime.timedelta(seconds=90.5),
        "tags": {"a", "b"},
        "nested": [{"lr": np.float64(1e-3)}, (np.bool_(True), "s")],
    }
    save_checkpoint(tmp_path / "c.pt", model=net(), extra=extra)
    got = load_checkpoint(tmp_path / "c.pt", model=net())["extra"]
    assert got.keys() == extra.keys()
    assert type(got["scalar"]) is np.float32 and got["scalar"] == 0.5
    assert type(got["count"]) is np.int64 and got["count"] == 7
    assert got["array"].dtype == np.int16 and (got["array"] == extra["array"]).all()
    assert got["path"] == extra["path"] and got["args"] == extra["args"]
    assert got["when"] == extra["when"] and got["day"] == extra["day"]
    assert got["took"] == extra["took"] and got["tags"] == {"a", "b"}
    assert got["nested"][0]["lr"] == 1e-3 and got["nested"][1][0] is np.True_


class Opaque:
    pass


def test_extra_that_cannot_load_back_is_refused_at_save(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="could not be loaded back weights-only"):
        save_checkpoint(tmp_path / "c.pt", model=net(), extra={"thing": Opaque()})
    with pytest.raises(TypeError, match=r"extra\['a'\] is a NumPy array of Python objects"):
        save_checkpoint(tmp_path / "c.pt", model=net(), extra={"a": np.array([object()])})
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_full_disk_raises_checkpoint_error_and_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    save_checkpoint(tmp_path / "c.pt", model=net(), step=1)
    old = (tmp_path / "c.pt").read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointError, match="No space left on device; the previous checkpoint"):
        save_checkpoint(tmp_path / "c.pt", model=net(), step=2)
    monkeypatch.undo()
    assert (tmp_path / "c.pt").read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary left behind


def test_a_directory_as_the_checkpoint_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is a directory: give the checkpoint file's path"):
        load_checkpoint(tmp_path, model=net())
    with pytest.raises(CheckpointError, match="is a directory; give a file path"):
        save_checkpoint(tmp_path, model=net())


def test_the_saving_topology_is_recorded(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "c.pt", model=net())
    topology = read_checkpoint(tmp_path / "c.pt")["topology"]
    assert topology == {"instances": 1, "replicas": 1, "local_replicas": 1}


def test_resuming_a_data_order_on_another_topology_is_refused(tmp_path: Path) -> None:
    data = torch.utils.data.TensorDataset(torch.arange(64))
    loader = DataLoader(Options().randomSeed(1).replicationFactor(4), data, batch_size=2)
    it = iter(loader)
    next(it)
    save_checkpoint(tmp_path / "c.pt", model=net(), dataloader=loader)
    other = DataLoader(Options().randomSeed(1).replicationFactor(2), data, batch_size=2)
    model = net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"cannot resume.*skip or repeat samples"):
        load_checkpoint(tmp_path / "c.pt", model=model, dataloader=other)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_save_from_an_older_generation_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = net()
    path = tmp_path / "c.pt"
    monkeypatch.setenv("POPDIST_GENERATION", "2")
    save_checkpoint(path, model=model, step=4)
    assert read_checkpoint(path)["generation"] == 2
    assert (tmp_path / ".c.pt.generation").read_text() == "2\n"
    monkeypatch.setenv("POPDIST_GENERATION", "1")  # an instance the relaunch left out
    with pytest.raises(CheckpointError, match=r"generation 1 .* but generation 2 has written"):
        save_checkpoint(path, model=model, step=9)
    assert read_checkpoint(path)["step"] == 4  # the survivors' checkpoint is untouched
    monkeypatch.setenv("POPDIST_GENERATION", "3")
    save_checkpoint(path, model=model, step=10)
    assert (read_checkpoint(path)["step"], (tmp_path / ".c.pt.generation").read_text()) == (
        10,
        "3\n",
    )
    monkeypatch.delenv("POPDIST_GENERATION")  # no generation at all reads as 0: refused too
    with pytest.raises(CheckpointError, match="generation 0"):
        save_checkpoint(path, model=model, step=11)


def test_host_field_places_each_hosts_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from popdist_torch.host_copies import resolve

    monkeypatch.setenv("POPDIST_HOST", "node7")
    assert resolve(tmp_path / "{host}" / "c.pt") == tmp_path / "node7" / "c.pt"
    assert resolve(tmp_path / "c.pt") == tmp_path / "c.pt"
    (tmp_path / "node7").mkdir()
    save_checkpoint(tmp_path / "{host}" / "c.pt", model=net(), step=3)
    assert read_checkpoint(tmp_path / "node7" / "c.pt")["step"] == 3


def test_resume_takes_no_damaged_copy(tmp_path: Path) -> None:
    from popdist_torch.checkpoint import resume_checkpoint

    model = net()
    path = tmp_path / "c.pt"
    save_checkpoint(path, model=model, step=5)
    assert resume_checkpoint(path, model=net()) == 5
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="looking for another host's copy"):
        assert resume_checkpoint(path, model=net()) == 0  # no other host holds one


def test_the_newest_copy_is_the_newest_generation_then_step() -> None:
    from popdist_torch.host_copies import choose

    assert choose([None, None]) is None
    assert choose([None, (0, 3), (0, 3)]) == ((0, 3), 1)
    # a cut-off host saved on alone (generation 0, step 9): the survivors' copy wins
    assert choose([(0, 9), (1, 6), None]) == ((1, 6), 1)
    assert choose([(1, 5), (1, 6), (1, 6)]) == ((1, 6), 1)
