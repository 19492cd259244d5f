"""The second room (pure): RunConfig → hosts → topology → devices → environment → mpirun argv.

``hosts`` (where the hosts come from: the ``HostSource`` seam), ``topology`` (instances,
replicas and NUMA nodes on hosts), ``devices`` (each instance's GPUs), ``environment`` (what
each instance and mpirun get), ``compact`` (each instance's values from its rank and a plan
the size of the host list), ``mpirun`` (the argv, O(hosts) words).
"""
