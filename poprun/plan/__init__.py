"""The second room (pure): RunConfig → hosts → topology → devices → environment → mpirun argv.

``hosts`` (where the hosts come from: the ``HostSource`` seam), ``topology`` (instances,
replicas and NUMA nodes on hosts), ``devices`` (each instance's GPUs), ``environment`` (what
each instance and mpirun get), ``mpirun`` (the argv, one app context per instance).
"""
