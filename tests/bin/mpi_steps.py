"""Steps of a light MPI job (no torch), for the tests of whose failure came first:
``mpi_steps.py DIR STEPS [PAUSE_S]``.

Every step is one allreduce over all instances (mpi4py); each instance appends the step to
``DIR/log/<instance>.g<generation>`` (``POPDIST_GENERATION``), so a test can wait for a step
before it kills the program. ``ELASTIC_SELF_SIGNAL=INSTANCE:STEP:SIGNUM``: that instance sends
itself SIGNUM (``os.kill``) once it logged STEP, in generation 0 only. At the end each
instance prints ``OK <instance> <generation> <instances>``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from mpi4py import MPI

import popdist  # under poprun: the error record, the progress records, the lease


def main() -> None:
    directory, steps = Path(sys.argv[1]), int(sys.argv[2])
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    generation = int(os.environ.get("POPDIST_GENERATION", "0") or 0)
    self_signal = [int(v) for v in os.environ.get("ELASTIC_SELF_SIGNAL", "").split(":") if v]
    comm, instance = MPI.COMM_WORLD, popdist.getInstanceIndex()
    (directory / "log").mkdir(exist_ok=True)
    with open(directory / "log" / f"{instance}.g{generation}", "a") as log:
        for step in range(1, steps + 1):
            comm.allreduce(step)
            log.write(f"{step}\n")
            log.flush()
            if generation == 0 and self_signal[:2] == [instance, step]:
                os.kill(os.getpid(), self_signal[2])
            time.sleep(pause)
    print(f"OK {instance} {generation} {popdist.getNumInstances()}", flush=True)


if __name__ == "__main__":
    main()
