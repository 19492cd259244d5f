"""Where poprun writes is checked before the launch: a usage error, not a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from poprun.config.paths import check_file_target, check_output_dir
from poprun.errors import PoprunError

pytestmark = pytest.mark.unit


def test_writable_places_pass(tmp_path: Path) -> None:
    check_output_dir("--output-dir", str(tmp_path / "new" / "deeper"), 2)
    check_output_dir("--output-dir", str(tmp_path), 2)
    check_file_target("--export-config", str(tmp_path / "run.yaml"))


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda t: str(t / "file" / "out"), "is a file, so the directory cannot be created"),
        (lambda t: "/proc/self/out", "kernel file system"),
        (lambda t: "/proc", "kernel file system"),
        (lambda t: str(t / "ro" / "out"), "which is not writable"),
        (lambda t: str(t / "hasdir"), "instance-1.stderr is a directory"),
    ],
)
def test_output_dir_problems(tmp_path: Path, make: object, says: str) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "ro").mkdir()
    (tmp_path / "hasdir" / "instance-1.stderr").mkdir(parents=True)
    if os.geteuid() == 0 and "not writable" in says:
        pytest.skip("root bypasses directory permissions")
    (tmp_path / "ro").chmod(0o555)
    try:
        with pytest.raises(PoprunError, match=says):
            check_output_dir("--output-dir", make(tmp_path), 2)  # type: ignore[operator]
    finally:
        (tmp_path / "ro").chmod(0o755)


def test_export_target_in_proc_is_refused() -> None:
    with pytest.raises(PoprunError, match="kernel file system"):
        check_file_target("--export-config", "/proc/self/x.yaml")
