"""Cluster engines as host sources: each reads its environment and files into an allocation (``allocation.py``)."""
