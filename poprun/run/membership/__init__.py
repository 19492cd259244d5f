"""Membership: the hosts of a job across hosts, how poprun watches them, and the lease that fences a cut-off host (``members``, ``watch``, ``lease``)."""
