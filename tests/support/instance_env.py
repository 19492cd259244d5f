"""The environment poprun gives an instance, set for one test (through ``monkeypatch``)."""

from __future__ import annotations

import pytest

from popdist import env


def as_instance(
    monkeypatch: pytest.MonkeyPatch,
    *,
    replicas: int,
    instances: int,
    index: int,
    ipus_per_replica: int = 1,
    uneven: bool = False,
) -> None:
    """This process becomes instance ``index`` of ``instances`` on one host, sharing
    ``replicas`` replicas of ``ipus_per_replica`` IPUs (``uneven``: split as poprun splits
    replicas that do not divide, the first ``replicas % instances`` holding one more)."""
    split = {}
    if uneven:
        counts = env.split_replicas(replicas, instances)
        split = {
            "num_local_replicas": counts[index],
            "replica_index_offset": sum(counts[:index]),
        }
    for name, value in env.instance_environment(
        num_total_replicas=replicas,
        num_ipus_per_replica=ipus_per_replica,
        num_instances=instances,
        instance_index=index,
        local_instance_index=index,
        num_local_instances=instances,
        host="localhost",
        **split,
    ).items():
        monkeypatch.setenv(name, value)
