"""mpirun pass-through arguments that would silently run something else are refused."""

from __future__ import annotations

import pytest

from poprun.config.mpi_args import check_mpi_args
from poprun.errors import PoprunError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "words",
    [
        ["--mca", "btl", "self,vader", "-x", "NCCL_DEBUG=INFO"],
        ["--bind-to", "core", "--report-bindings", "--map-by", "slot"],
        ["--mca=x"],
        [],
    ],
)
def test_ordinary_mpirun_options_pass(words: list[str]) -> None:
    check_mpi_args("--mpi-global-args", words)


@pytest.mark.parametrize(
    ("words", "says"),
    [
        (["-np", "4"], "use poprun's --num-instances"),
        (["-n", "2"], "use poprun's --num-instances"),
        (["-H", "a,b"], "use poprun's --host or --host-file"),
        (["--hostfile", "h"], "use poprun's --host or --host-file"),
        (["--app", "f"], "poprun writes the app contexts"),
        (["-x", "POPDIST_NUM_INSTANCES=3"], "leave POPDIST_* to poprun"),
        (["echo"], "'echo' is not an mpirun option"),
        (["--report-bindings", "echo"], "'echo' is not an mpirun option"),
        (["--mca", "a", "b", "stray"], "'stray' is not an mpirun option"),
    ],
)
def test_conflicts_and_stray_words_are_refused(words: list[str], says: str) -> None:
    with pytest.raises(PoprunError, match="--mpi-local-args=") as error:
        check_mpi_args("--mpi-local-args", words)
    assert says in str(error.value)
