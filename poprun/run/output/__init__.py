"""Where the job's bytes go, and poprun's own streams.

``fifos`` (instances on poprun's host write straight to poprun), ``tags`` (mpirun's tagged
pipes, for instances on other hosts), ``instance_stream`` (one instance's stdout or stderr:
lines, prefix, file copy, tail), ``router`` (one job's streams, pids, error records and
mpirun's messages), ``console`` (poprun's own stdout/stderr, closed or vanishing).
"""
