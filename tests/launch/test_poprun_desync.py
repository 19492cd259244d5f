"""Issue 27's desync with the Horovod backend (the default): the job ends with both calls named.

Horovod checks each tensor's shape itself and raises on every instance, so nothing hangs; the
verdict must still name both instances' calls and their sites, as with ``--backend torch``
(``test_poprun_hang.py``). Real poprun → real mpirun, two instances; instance 1 is the odd one.
"""

from __future__ import annotations

import sys

import pytest

from tests.support.jobs import assert_no_descendants
from tests.support.jobs import run_poprun as poprun

pytestmark = pytest.mark.launch

TWO = ("--num-replicas", "2", "--num-instances", "2")


def _sides(err: str) -> dict[int, str]:
    """Each instance's line of the desync verdict."""
    assert "poprun: the instances are out of step" in err, err
    sides = {}
    for instance in (0, 1):
        head = f"poprun:   instance {instance} (host localhost): "
        sides[instance] = next(line for line in err.splitlines() if line.startswith(head))
    return sides


def test_a_wider_layer_on_one_instance_is_named_at_the_parameters_broadcast() -> None:
    """Horovod's ``broadcast_parameters`` meets the differing parameters first: the one
    broadcast of all of them is compared as one call (49 against 97 elements)."""
    done = poprun(*TWO, sys.executable, "tests/bin/hang.py", "desync", timeout=90)
    assert done.returncode == 1, done.stderr
    sides = _sides(done.stderr)
    for instance, elements in ((0, 49), (1, 97)):
        line = sides[instance]
        assert f"broadcast_tensors '4 tensors' shape ({elements},) float32" in line, line
        assert "called at " in line and "hang.py:" in line and " in train" in line, line
    # (when Horovod's error reached poprun first, the instance's report follows the verdict)
    assert done.stderr.rstrip().endswith("exit code 1")
    assert_no_descendants()


@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_an_allreduce_of_different_shapes_names_both_sites(backend: str) -> None:
    done = poprun(
        *TWO, "--backend", backend, sys.executable, "tests/bin/desync_metric.py", timeout=90
    )
    assert done.returncode == 1, done.stderr
    sides = _sides(done.stderr)
    for instance, shape in ((0, "(2,)"), (1, "(3,)")):
        line = sides[instance]
        assert f"allreduce 'metrics' shape {shape} float32" in line, line
        assert "desync_metric.py:" in line and " in sum_metrics" in line, line
    if backend == "horovod":  # Horovod refuses on both; torch's instance 1 reduces garbage
        assert "instance 0 done" not in done.stdout and "instance 1 done" not in done.stdout
    assert_no_descendants()
