"""The first room: a command line (and an optional YAML file) → one frozen, validated RunConfig.

``options`` (the option table), ``command`` (typer's command from it, for ``--help``),
``run_config`` (RunConfig, the rules between options),
``config_file`` (``--import-config``/``--export-config``), ``user_files`` (reading what a
user names, untrusted), ``mpi_args`` and ``paths`` (checks before anything is launched).
"""
