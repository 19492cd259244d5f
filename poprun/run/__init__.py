"""The third room (side effects): start mpirun, carry out the ending policy, report.

``supervisor`` (the event loop), ``ending`` (the pure ending policy: events and a clock in,
decisions out), ``verdict`` (exit code and root-cause report), ``evidence`` (what names a
failing instance), ``signals`` (poprun's signal handlers, installed and restored),
``processes`` and ``leftovers`` (the job's processes, what they leave behind),
``ssh_check`` (remote hosts reachable before launch), ``output/`` (the job's bytes).
"""
