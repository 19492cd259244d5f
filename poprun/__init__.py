"""poprun: launch PopDist instances on Open MPI, PopRun's command lines unchanged."""

__version__ = "0.1.0"
