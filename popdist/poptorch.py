"""``popdist.poptorch.Options``: PopTorch options that follow the poprun launch.

The class is the executor's :class:`popdist_torch.PopdistOptions`, re-exported under
PopDist's name: the replication factor is this instance's local replica count, the
distributed process id/count are the instance index/count, and the setters that would
contradict the launch are locked. Importing this module imports torch.
"""

from __future__ import annotations

from popdist_torch.options import PopdistOptions as Options

__all__ = ["Options"]
