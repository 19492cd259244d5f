"""What the test tiers share, in one place: no tier imports another tier's tests or conftest.

``jobs`` runs whole jobs (poprun, mpirun) and waits on their output; ``processes`` reads
the suite's children from /proc and reaps them; ``topology`` is the topology-invariance case
(models, optimizers, the single-process reference) that the parallel tier, the multi-host
tier and ``tests/bin/executor_topology.py`` run; ``data`` holds small datasets, options and
models the unit and parallel tiers both use.
"""
