"""Cluster engines as host sources: each reads what it gives a job (its variables and files)
into an allocation (``allocation.py``); ``detect.py`` says which engine's job poprun runs in.
Slurm's reader is :mod:`poprun.plan.slurm`; the others are here, one module each."""
