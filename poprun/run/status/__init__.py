"""What poprun tells about a running job's progress, from the instances' figures.

``stragglers`` (pure: the per-instance table printed at the end of a multi-instance run and
on the summary signal, and which instance held the others up), ``metrics`` (pure: the
figures as Prometheus metric families and as JSON), ``server`` (``--status-port``: the
HTTP endpoint, on a daemon thread), ``view`` (when the supervisor prints them), ``figures``
(what they read of an instance, and the figures derived from it). The figures themselves come from the progress board
(:mod:`poprun.run.progress`), which the instances' progress records fill.
"""
