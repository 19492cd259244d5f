"""Each instance's GPUs: CUDA_VISIBLE_DEVICES slices, the user's override, bad pools."""

from __future__ import annotations

import io
import stat
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from poprun.cli import main
from poprun.config import run_config as cfg
from poprun.errors import PoprunError
from poprun.plan.compact import instance_values, plan_launch
from poprun.plan.devices import check_pool, device_pool, instance_devices
from poprun.plan.environment import forwarded_names
from poprun.plan.mpirun import build_argv
from poprun.plan.topology import plan

pytestmark = pytest.mark.unit

ENV = {"PATH": "/usr/bin:/bin"}


def _visible(argv: list[str]) -> list[str]:
    """Each instance's slice, as its wrapper works it out from the command's compact plan."""
    return argv[-1].split("|")


def _argv(*cli: str, environ: dict[str, str] | None = None) -> list[str]:
    """The mpirun argv, and last the instances' ``CUDA_VISIBLE_DEVICES`` joined by ``|``."""
    environ = environ if environ is not None else ENV
    values = dict(zip(cli[::2], cli[1::2], strict=True))
    config = cfg.build(values, ("/bin/true",), environ)
    topology = plan(config, {})
    pool = device_pool(environ)
    check_pool(topology, pool)
    argv = build_argv(
        config,
        topology,
        mpirun="mpirun",
        forwarded=forwarded_names(environ),
        is_root=False,
        local_cpus=2,
        device_pool=pool,
    )
    assert not any(a.startswith("CUDA_VISIBLE_DEVICES=") for a in argv)  # each derives its own
    launch = plan_launch(config, topology, pool)
    slices = [instance_values(launch, p.index)["CUDA_VISIBLE_DEVICES"] for p in topology.instances]
    return [*argv, "|".join(slices)]


def test_instances_of_a_host_take_consecutive_slices() -> None:
    # 2 instances x 2 local replicas x 2 devices per replica: 4 devices each.
    argv = _argv("num_replicas", "4", "num_instances", "2", "ipus_per_replica", "2")
    assert _visible(argv) == ["0,1,2,3", "4,5,6,7"]


def test_one_instance_with_local_replicas_gets_one_device_per_replica() -> None:
    assert _visible(_argv("num_replicas", "4")) == ["0,1,2,3"]
    assert _visible(_argv("num_replicas", "2", "num_instances", "2")) == ["0", "1"]


def test_the_users_list_is_the_pool_and_is_not_forwarded_as_is() -> None:
    environ = {**ENV, "CUDA_VISIBLE_DEVICES": "4, 5,6,7"}
    argv = _argv("num_replicas", "2", "num_instances", "2", environ=environ)
    assert _visible(argv) == ["4", "5"]
    assert "CUDA_VISIBLE_DEVICES" not in forwarded_names(environ)
    assert ["-x", "CUDA_VISIBLE_DEVICES"] not in [argv[i : i + 2] for i in range(len(argv))]
    assert "p4,5,6,7" in argv  # the pool, in the wrapper's plan


def test_an_empty_list_hides_every_gpu() -> None:
    environ = {**ENV, "CUDA_VISIBLE_DEVICES": ""}
    argv = _argv("num_replicas", "2", "num_instances", "2", environ=environ)
    assert _visible(argv) == ["", ""]


def test_a_short_pool_gives_the_last_instance_what_is_left() -> None:
    config = cfg.build({"num_replicas": "4", "num_instances": "2"}, ("/bin/true",), ENV)
    plans = plan(config, {}).instances
    assert [instance_devices(p, ("0", "1", "2")) for p in plans] == ["0,1", "2"]


def test_a_pool_that_leaves_an_instance_without_a_device_is_refused() -> None:
    with pytest.raises(PoprunError) as info:
        _argv(
            "num_replicas", "4", "num_instances", "2",
            environ={**ENV, "CUDA_VISIBLE_DEVICES": "0,1"},
        )  # fmt: skip
    message = str(info.value)
    assert message.startswith("CUDA_VISIBLE_DEVICES=0,1: lists 2 device(s)")
    assert "local instance 1 would get none" in message and "at least 4" in message


def test_the_cli_exits_2_on_a_short_pool_and_launches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    mpirun = fake / "mpirun"
    mpirun.write_text(f"#!/bin/sh\ntouch {tmp_path}/CALLED\n")
    mpirun.chmod(mpirun.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main(["--num-replicas", "2", "--num-instances", "2", "true"])
    assert code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and "CUDA_VISIBLE_DEVICES=3" in lines[0] and "fix:" in lines[0]
    assert not (tmp_path / "CALLED").exists()


def test_the_users_popdist_tuning_variables_reach_the_instances_and_no_other() -> None:
    """A stale contract variable is dropped; POPDIST_TORCH_* tuning is the user's to pass."""
    from poprun.plan.environment import mpirun_environment

    environ = {
        "POPDIST_NUM_INSTANCES": "9",
        "POPDIST_TORCH_TIMEOUT": "77",
        "POPDIST_TORCH_CPU_ALLREDUCE": "gloo",
        "MY_VAR": "1",
    }
    assert forwarded_names(environ) == [
        "MY_VAR",
        "POPDIST_TORCH_CPU_ALLREDUCE",
        "POPDIST_TORCH_TIMEOUT",
    ]
    config = cfg.build({"num_replicas": "2", "num_instances": "2"}, ("/bin/true",), environ)
    env = mpirun_environment(config, environ)
    assert env["POPDIST_TORCH_TIMEOUT"] == "77" and env["POPDIST_TORCH_CPU_ALLREDUCE"] == "gloo"
    assert "POPDIST_NUM_INSTANCES" not in env


def test_print_topology_names_the_gpus_an_instance_leaves_idle(tmp_path: Path) -> None:
    """Issue 55: 1 instance × 8 replicas on an 8-GPU host computes on one GPU (its local
    replicas share it): --print-topology says so, with the launch that uses every GPU."""
    from poprun.plan.devices import gpus_here, idle_gpus_line

    listing = tmp_path / "gpus"
    listing.mkdir()
    for i in range(8):
        (listing / f"0000:{i:02x}:00.0").mkdir()
    assert gpus_here({}, str(listing)) == 8
    assert gpus_here({"CUDA_VISIBLE_DEVICES": "4,5"}, str(listing)) == 2
    assert gpus_here({}, str(tmp_path / "none")) == 0
    one = plan(cfg.RunConfig(program=("p",), num_instances=1, num_replicas=8))
    assert idle_gpus_line(one, 8) == (
        "poprun: each instance computes on 1 of the 8 GPUs it is given (its 8 local replicas "
        "share them; 7 idle); to use every GPU run one instance per GPU: poprun "
        "--num-instances 8 --num-replicas 8"
    )
    staged = plan(cfg.RunConfig(program=("p",), num_replicas=2, ipus_per_replica=2))
    assert idle_gpus_line(staged, 4).endswith(
        "one instance per replica, 2 GPUs each: poprun --num-instances 2 --num-replicas 2 "
        "--ipus-per-replica 2"
    )
    spread = plan(cfg.RunConfig(program=("p",), num_instances=8, num_replicas=8))
    assert idle_gpus_line(spread, 8) == "" and idle_gpus_line(one, 0) == ""
