"""What a library checks of ``poptorch`` before and after importing it, as one JSON line.

Run with ``POPDIST_POPTORCH_MODULES=1`` (tests/launch/test_poptorch_modules.py): the checks
Lightning, transformers, optimum-graphcore and Graphcore's applications make, in their order
(``find_spec`` first, without importing), then that every PopTorch name is the project's
module itself and that no module of the project was loaded twice.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
from collections import Counter

report: dict[str, object] = {}
spec = importlib.util.find_spec("poptorch")  # Lightning's package_available
report["find_spec"] = spec is not None
report["torch_before_import"] = "torch" in sys.modules  # find_spec imports nothing
report["metadata"] = importlib.metadata.version("poptorch")

from transformers.utils.versions import require_version  # noqa: E402

require_version("poptorch>=3.3")  # optimum-graphcore's generation
report["require_version"] = True

import popart  # noqa: E402
import poptorch  # noqa: E402
import poptorch.optim as optim  # noqa: E402
from poptorch import DataLoaderMode, Options, OutputMode, PoplarExecutor  # noqa: E402
from poptorch._impl import rewrapModelIfNecessary, unwrapModelIfNecessary  # noqa: E402
from poptorch.enums import ReductionType  # noqa: E402
from poptorch.optim import LAMB, AdamW  # noqa: E402

import popdist.poptorch  # noqa: E402
import popdist_torch  # noqa: E402

report["version"] = poptorch.__version__
report["same_module"] = poptorch is popdist_torch and optim is popdist_torch.optim
report["same_objects"] = (
    poptorch.trainingModel is popdist_torch.trainingModel
    and PoplarExecutor is popdist_torch.PoplarExecutor
    and Options is popdist_torch.Options
    and AdamW is popdist_torch.optim.AdamW
    and LAMB is popdist_torch.optim.LAMB
    and ReductionType is popdist_torch.enums.ReductionType
    and popart is popdist_torch.popart
    and (DataLoaderMode, OutputMode) == (popdist_torch.DataLoaderMode, popdist_torch.OutputMode)
)
report["popdist_options"] = issubclass(popdist.poptorch.Options, poptorch.Options)

# optimum-graphcore: IPUConfig._to_options, its trainer, its pipelines
report["ipu_version"] = poptorch.ipuHardwareVersion()
report["ipu_available"] = [poptorch.ipuHardwareIsAvailable(n) for n in (1, 8)]
model = popdist_torch.trainingModel(__import__("torch").nn.Linear(2, 1))
report["isinstance"] = isinstance(model, poptorch._poplar_executor.PoplarExecutor)
unwrapModelIfNecessary(model.model)
rewrapModelIfNecessary(model.model)
report["popart_value"] = int(popart.SubgraphCopyingStrategy.JustInTime)
report["core_error"] = issubclass(poptorch.poptorch_core.Error, RuntimeError)
poptorch.setLogLevel("ERR")

# one module object per file: no module of the project loaded twice under two names
files = Counter(
    getattr(m, "__file__", None)
    for m in {id(m): m for m in list(sys.modules.values()) if m is not None}.values()
)
project = ("popdist_torch", "popdist", "_popdist_poptorch")
report["duplicates"] = sorted(
    f for f, n in files.items() if f and n > 1 and any(f"/{p}/" in f for p in project)
)
report["project_modules"] = sum(1 for f in files if f and "/popdist_torch/" in f)
aliases = {n: m for n, m in sys.modules.items() if n.split(".")[0] in ("poptorch", "popart")}
report["aliases"] = sorted(aliases)
report["aliases_are_project_modules"] = all(
    getattr(m, "__name__", "").startswith("popdist_torch") for m in aliases.values()
)
report["spec_kept"] = popdist_torch.__spec__ is not None and (
    popdist_torch.__spec__.name == "popdist_torch"
)
print("LIBRARY " + json.dumps(report), flush=True)
