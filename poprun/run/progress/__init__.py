"""What the instances report of their progress, and the verdicts poprun draws from it.

``board.py``: the :class:`~poprun.run.progress.board.ProgressBoard` the router feeds from
the instances' progress records (:mod:`popdist.progress`); ``diagnosis.py``: the reports of a
hung job, of instances out of step (desync) and the note on a long wait.
"""
