"""The PopTorch surface room: every public PopTorch name, one table, and what it makes.

- :mod:`~popdist_torch.surface.rows`: what a row is (owner, name, supported / no-op /
  refused, why) and the callable a refused row stands for;
- :mod:`~popdist_torch.surface.names`: the table itself, ``NAMES``;
- :mod:`~popdist_torch.surface.toplevel`: PopTorch's top-level functions beside the models
  (hardware queries, logging, hooks, errors) and the refused top-level names;
- :mod:`~popdist_torch.surface.ops`: PopTorch's in-model helpers (``nop``, ``for_loop``,
  ``MultiConv``...);
- :mod:`~popdist_torch.surface.graph_ops`: the ``torch.ops.poptorch`` operators, registered
  with torch when :mod:`popdist_torch` is imported;
- :mod:`~popdist_torch.surface.page`: ``docs/poptorch-names.md``, rendered from the table.

The options room (:mod:`popdist_torch.options`) generates its no-op and refused setters from
the table; the executor its refused methods. Nothing here imports them.
"""

from popdist_torch.surface.names import NAMES, OPTION_OWNERS, rows_of
from popdist_torch.surface.rows import NO_OP, REFUSED, SUPPORTED, Row

__all__ = ["NAMES", "NO_OP", "OPTION_OWNERS", "REFUSED", "SUPPORTED", "Row", "rows_of"]
