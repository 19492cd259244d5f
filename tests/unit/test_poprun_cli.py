"""The command line: PopRun's spellings, config export/import, dry run, V-IPU options."""

from __future__ import annotations

from pathlib import Path

import pytest

from poprun.cli import main, normalise

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
    assert "POPDIST_NUM_LOCAL_REPLICAS=2" in out and "POPDIST_OFFLINE_MODE=1" in out


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
