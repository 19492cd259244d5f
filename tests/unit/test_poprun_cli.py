"""The command line: PopRun's spellings, config export/import, dry run, V-IPU options."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from poprun.cli import main, normalise
from poprun.config.run_config import RunConfig
from poprun.plan.environment import ALLOCATOR_DEFAULTS, with_allocator_defaults

pytestmark = pytest.mark.unit

BASE = ["--num-replicas", "8", "--num-instances", "4", "--ipus-per-replica", "2"]


def _dry(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main([*args, "--dry-run=yes", "/bin/echo", "a b"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--offline-mode", "prog"], ["--offline-mode=yes"]),
        (["--offline-mode", "no", "prog"], ["--offline-mode=no"]),
        (["--offline-mode=1", "prog"], ["--offline-mode=1"]),
        (["--num-replicas", "4", "prog"], ["--num-replicas=4"]),
        (["-H", "a,b", "-vv", "prog"], ["--host=a,b", "-v", "-v"]),
        (["-Hnode[0-1]", "prog"], ["--host=node[0-1]"]),
    ],
)
def test_option_forms(args: list[str], expected: list[str]) -> None:
    assert normalise([*args, "--x"]) == (expected, ["prog", "--x"])


def test_program_arguments_are_never_parsed() -> None:
    assert normalise(["--num-replicas=2", "python", "-m", "mod", "--num-replicas", "9"]) == (
        ["--num-replicas=2"],
        ["python", "-m", "mod", "--num-replicas", "9"],
    )


def test_export_then_import_reproduces_the_argv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.yaml"
    args = [
        *BASE,
        "-H",
        "localhost",
        "--mpi-global-args=--mca btl_tcp_if_include 'lo'",
        '--instance-mpi-local-args=1:-x A="x y"',
        "--offline-mode",
        "yes",
        "--executable-cache-path",
        str(tmp_path / "cache"),
        "--process-placement",
        "disabled",
    ]
    first = _dry(capsys, *args, "--export-config", str(path))
    assert path.read_text().startswith("num-instances: 4\n")
    assert _dry(capsys, "--import-config", str(path)) == first
    # the command line wins over the file
    assert "POPDIST_NUM_TOTAL_REPLICAS=4" in _dry(
        capsys, "--import-config", str(path), "--num-replicas", "4"
    )
    assert main([*BASE, "--export-config", str(path), "/bin/true"]) == 2  # refuses to overwrite
    capsys.readouterr()
    assert (
        main(
            [
                *BASE,
                "--export-config",
                str(path),
                "--overwrite-config",
                "yes",
                "--dry-run=yes",
                "/bin/true",
            ]
        )
        == 0
    )


def test_yaml_keys_with_underscores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("num_replicas: 4\nnum_instances: 2\noffline_mode: yes\nhost: [localhost]\n")
    out = _dry(capsys, "--import-config", str(path))
    assert "POPDIST_NUM_TOTAL_REPLICAS=4" in out and "POPDIST_NUM_INSTANCES=2" in out
    assert "POPDIST_OFFLINE_MODE=1" in out  # the job's values; each instance derives its own


def test_vipu_options_are_accepted_with_one_warning(capsys: pytest.CaptureFixture[str]) -> None:
    out = _dry(
        capsys,
        "--vipu-server-host",
        "h",
        "--vipu-partition=p",
        "--update-partition",
        "yes",
        "--num-ilds",
        "1",
    )
    err = capsys.readouterr().err
    assert "mpirun" in out
    assert (
        main(["--vipu-server-host", "h", "--vipu-partition=p", "--dry-run=yes", "/bin/true"]) == 0
    )
    err = capsys.readouterr().err
    assert err.count("no V-IPU") == 1 and "--vipu-partition" in err


def test_print_topology_and_verbose_log(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--print-topology", "-v", "--dry-run=yes", "/bin/true"]) == 0
    captured = capsys.readouterr()
    assert "| localhost | 3        | 3     | 6-7      | 12-15   |" in captured.out
    assert " POPRUN [I] Running command: " in captured.err
    assert "one NUMA node" in captured.err


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("poprun ")
    assert main(["--help"]) == 0
    assert "--num-replicas" in capsys.readouterr().out


def test_instances_keep_freed_memory_unless_told_not_to(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("MALLOC_")] + ["GLIBC_TUNABLES"]:
        monkeypatch.delenv(name, raising=False)
    tuned = _dry(capsys, *BASE).split()
    for name in [*ALLOCATOR_DEFAULTS, "GLIBC_TUNABLES"]:
        assert tuned[tuned.index(name) - 1] == "-x"  # forwarded to every instance, by name
    assert "MALLOC_" not in _dry(capsys, *BASE, "--use-default-allocator")
    assert "GLIBC_TUNABLES" not in _dry(capsys, *BASE, "--use-default-allocator")
    assert "MALLOC_" not in _dry(capsys, *BASE, "--use-default-allocator", "yes")
    assert "MALLOC_MMAP" in _dry(capsys, *BASE, "--use-default-allocator", "no")


def test_allocator_option_round_trips_through_the_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.yaml"
    _dry(capsys, *BASE, "--use-default-allocator", "--export-config", str(path))
    assert "use-default-allocator: true" in path.read_text()
    assert "MALLOC_" not in _dry(capsys, "--import-config", str(path))


HUGE = "glibc.malloc.hugetlb=1"


@pytest.mark.parametrize(
    ("environ", "thresholds", "tunables"),
    [
        ({}, True, HUGE),
        # not about malloc: kept, huge pages appended
        ({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F"}, True, f"glibc.cpu.hwcaps=-AVX512F:{HUGE}"),
        ({"MALLOC_ARENA_MAX": "2"}, False, HUGE),  # any MALLOC_* is the user's choice
        ({"MALLOC_TRIM_THRESHOLD_": "131072"}, False, HUGE),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, False, f"glibc.malloc.trim_threshold=0:{HUGE}"),
        # 4 KB pages asked for: the thresholds still come, the user's word on pages stands
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, True, "glibc.malloc.hugetlb=0"),
        ({"GLIBC_TUNABLES": "glibc.mem.tagging=0:glibc.malloc.hugetlb=2"}, True, None),
    ],
)  # fmt: skip
def test_the_users_allocator_choice_wins(
    environ: dict[str, str], thresholds: bool, tunables: str | None
) -> None:
    got = with_allocator_defaults(RunConfig(program=("p",)), {"PATH": "/bin", **environ})
    assert {k: got[k] for k in environ if k != "GLIBC_TUNABLES"} == {
        k: v for k, v in environ.items() if k != "GLIBC_TUNABLES"
    }
    assert all((got.get(name) == value) == thresholds for name, value in ALLOCATOR_DEFAULTS.items())
    assert got["GLIBC_TUNABLES"] == (tunables or environ["GLIBC_TUNABLES"])
    off = with_allocator_defaults(RunConfig(program=("p",), use_default_allocator=True), {})
    assert off == {}


@pytest.mark.parametrize("word", ["on", "off", "y", "n", "TRUE", "No"])
def test_every_yes_no_word_is_taken_as_the_value_not_the_program(word: str) -> None:
    # Once `--offline-mode on true` read `on` as the program: the words come from one table.
    assert normalise(["--offline-mode", word, "true"]) == ([f"--offline-mode={word}"], ["true"])


def test_the_option_table_drives_help_yaml_and_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from typer.main import get_command

    from poprun.config.command import typer_app
    from poprun.config.options import OPTIONS

    command = get_command(typer_app())
    spelled = {decl for param in command.params for decl in param.opts}
    for option in OPTIONS:
        assert set(option.spellings) <= spelled, option.key
    assert main(["--help"]) == 0
    shown = capsys.readouterr().out
    assert all((option.name in shown) != option.hidden for option in OPTIONS)
    # every exported option reads back from YAML to the same configuration
    path = tmp_path / "all.yaml"
    args = [*BASE, "--backend", "torch", "--timeout", "30", "--host-subnet", "lo"]
    args += ["--only-output-from-instance", "0"]
    first = _dry(capsys, *args, "--output-dir", str(tmp_path), "--export-config", str(path))
    exported = path.read_text()
    for key in (
        "backend: torch",
        "timeout: 30.0",
        "host-subnet: lo",
        "output-dir: ",
        "instance: 0",
    ):
        assert key in exported
    assert _dry(capsys, "--import-config", str(path)) == first


@pytest.mark.parametrize(
    ("args", "expected"),
    [([], "auto"), (["--backend", "torch"], "torch"), (["--backend", "horovod"], "horovod")],
)
def test_backend_is_exported_to_every_instance(args: list[str], expected: str) -> None:
    from poprun.config.run_config import build
    from poprun.plan.environment import mpirun_environment

    config = build({"backend": args[1]} if args else {}, ("true",), {"PATH": "/bin:/usr/bin"})
    assert config.backend == expected
    assert mpirun_environment(config, {"POPDIST_BACKEND": "stale"})["POPDIST_BACKEND"] == expected


def test_backend_from_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("backend: torch\n")
    assert main(["--import-config", str(path), "--export-config", str(tmp_path / "o.yaml")]) == 0
    assert "backend: torch" in (tmp_path / "o.yaml").read_text()
    path.write_text("backend: mpi\n")
    assert main(["--import-config", str(path), "--dry-run=yes", "true"]) == 2
    assert "--backend=mpi: is not one of the choices; fix: use auto or horovod or torch" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("seconds", ["2147484", "8640000", "1e9"])
def test_a_time_out_longer_than_the_timers_limit_is_accepted(
    seconds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """24.8 days is epoll's longest single wait, not the user's limit: poprun waits in steps."""
    assert main(["--timeout", seconds, "--dry-run=yes", "true"]) == 0, capsys.readouterr().err


def test_a_job_across_hosts_takes_the_tcp_path_when_this_host_has_no_fabric(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from poprun.plan import fabric

    monkeypatch.setattr(fabric, "DEVICE_CLASSES", (str(tmp_path),))
    monkeypatch.setattr(fabric, "DEVICE_FILES", ())
    hosts = ["--num-replicas=2", "--num-instances=2", "-H", "localhost,node1"]
    assert "--mca pml ob1 " in _dry(capsys, *hosts)
    assert "--mca pml" not in _dry(capsys, *hosts[:2], "-H", "node0,node1")  # launched outside
    (tmp_path / "mlx5_0").mkdir()
    assert "--mca pml" not in _dry(capsys, *hosts)  # a fabric here: Open MPI's own choice
