"""poprun: launch PopDist instances on Open MPI."""
