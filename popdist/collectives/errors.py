"""The collectives' error: a backend that is missing, failed, or disagrees with the run.

:class:`CollectiveError` is a :class:`~popdist.env.PopdistError` (so a ``RuntimeError``):
``popdist.init()`` raises it, and ``popdist_torch`` re-exports it for its users.
"""

from __future__ import annotations

from popdist.env import PopdistError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from popdist.env import RunView

__all__ = ["CollectiveError", "world_mismatch"]


class CollectiveError(PopdistError):
    """The collective backend is missing, failed, or disagrees with the run or the options."""


def world_mismatch(who: str, rank: int, size: int, run: RunView) -> CollectiveError:
    """The error for a backend (``who``) whose world is not the run the environment gives."""
    where = "poprun's POPDIST_*" if run.from_poprun else "the environment"
    return CollectiveError(
        f"{who} sees rank {rank} of {size} processes but {where} says instance "
        f"{run.instance_index} of {run.num_instances}: start every instance from one poprun "
        f"(or mpirun) command and do not mix launchers"
    )
