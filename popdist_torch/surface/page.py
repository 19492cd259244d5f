"""``docs/poptorch-names.md``, rendered from the surface table.

``python -m popdist_torch.surface.page`` writes the page; a unit test checks that the
committed page is this rendering, so the page and the code cannot disagree.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from popdist.env import POPTORCH_MODULES
from popdist_torch.surface.names import ENUMS, MODELS, NAMES, OPS, PARALLEL
from popdist_torch.surface.rows import REFUSED, Row

__all__ = ["PAGE", "render"]

#: The opt-in PopTorch module names, as the page writes the setting.
OPT_IN = f"{POPTORCH_MODULES}=1"

#: Where the page lives in the repository.
PAGE = Path("docs") / "poptorch-names.md"

INTRO = """\
# PopTorch names: every public name and what it does here

<!-- Rendered from popdist_torch/surface/names.py by `python -m popdist_torch.surface.page`;
edit the table there, not this page (a unit test compares them). -->

`import popdist_torch as poptorch` stands in for PopTorch; with `{opt_in}`
(`poprun --poptorch-modules`) the program's own `import poptorch` does (the module names below).
This page lists every public name of PopTorch 3 (its `poptorch/__init__.py`, `ops.py`,
`options.py`, `enums.py` and the API reference of its user guide), plus the names PopTorch 2.x deprecated that older scripts and the Lightning
IPU pages still use (`AnchorMode`, `Options.anchorMode`) and PopTorch 2's
`Precision.autocastEnabled`, the operators PopTorch registers with torch (`torch.ops.poptorch`)
and the `popart` names PopTorch programs use. Each name is one of:

- **supported**: does what PopTorch does (on CPU or GPU instead of IPUs);
- **no-op**: accepted, so the script runs; it changes nothing here, for the reason given (what
  PopTorch does with it, and why that has no effect here). Option no-ops record their value,
  which shows in `opts.toDict()`;
- **refused**: reachable (so `hasattr` and imports work), but calling it raises
  `poptorch.UnsupportedOptionError` (a `RuntimeError`) with the message quoted, which names
  what to use instead.

A name that PopTorch does not have raises `AttributeError`, as any module does. The page is
rendered from one table, `popdist_torch/surface/names.py`, which also generates the no-op and
refused setters of `Options` and its groups and every refused name's error; the test
`tests/unit/test_poptorch_surface.py` checks that this page is the table's rendering and that
every name resolves. The seed documents' listings run unchanged but for their imports
(`tests/seeds/`, `tests/parallel/test_seed_listings.py`), and with their own imports too under
the opt-in below (`tests/launch/test_poptorch_unchanged.py`, which also runs `examples/` so).

## Decisions

- **Auto-staging, as PopTorch.** A model whose `Block` contexts, `BeginBlock` modules or
  `BlockFunction`s carry an `ipu_id`, wrapped with no `setExecutionStrategy`, runs as
  `PipelinedExecution(AutoStage.SameAsIpu)`: the blocks of one `ipu_id` form one stage on that
  device, stages in device order. `Block` contexts are seen only when forward runs, so the first
  call watches its forward: at the first placed `Block` it stops the forward (before any backward
  or optimizer step) and runs the call again through the stages. `Block` contexts *without* an
  `ipu_id` and no strategy leave the model whole (PopTorch would refuse the model) and warn once,
  in one line: give each `Block` an `ipu_id`, or set a strategy. `BeginBlock` modules without an
  `ipu_id` keep the earlier behaviour: one stage per block, stage *i* on device *i*.
- **Phased execution runs as the sharded schedule.** `SerialPhasedExecution`,
  `ParallelPhasedExecution` and `PhasedExecution` (the tutorial's name; here the serial one) take
  their phases as PopTorch does and run the phases' stages one after the other, as
  `ShardedExecution` does. On an IPU, phases trade speed for memory; here every weight stays where
  it is, so the results are those of the phases. An unplaced stage runs on the device of its
  position within its phase.
- **The hardware queries: no IPUs, unless the program asked to run as if on them.** Without
  the opt-in, `ipuHardwareIsAvailable()` is `False` and `ipuHardwareVersion()` is refused: there
  are no IPUs, and scripts that branch on it take their "no hardware" path, usually
  `opts.useIpuModel(True)`, which is a no-op here (the model runs on the same executor either
  way). With `{opt_in}` the program runs as if on a Mk2 machine that has the
  run's devices, which is what optimum-graphcore (`ipuHardwareVersion() in (2, 21)`) and
  Graphcore's applications (`!= 2`) check before they build anything: `ipuHardwareVersion()` is
  `2`, and `ipuHardwareIsAvailable(n)` is `True` for `n` from 1 to the run's devices: under
  `poprun` its replicas times `--ipus-per-replica`; in a process `poprun` did not launch, any
  `n` (the process is its own run, and gives its replicas and stages the devices it asks for).
- **Options read back by name, as PopTorch's.** Any value of `Options` or a group reads as an
  attribute under PopTorch's name (`opts.device_iterations`, `opts.Training.gradient_accumulation`,
  `opts.Distributed.num_distributed_processes`, `opts.log_dir`), and `opts("name")` reads it too;
  the main values also accept assignment (`opts.replication_factor = 2` calls
  `replicationFactor(2)`). Under `poprun` the distributed values are the instance's.
- **PopART options are kept, not applied.** `opts._Popart.set(key, value)` keeps the value under
  its PopART name in `opts._Popart.options` (and `opts.toDict()["_Popart"]`); there is no PopART
  session, so it changes nothing. A key that is no PopART session option warns once, as a likely
  typo. `import popdist_torch.popart as popart` (or `import popart` with the opt-in) has
  PopART's enumerations with their integer values.
- **Deprecated aliases warn.** `poptorch.AnchorMode`, `Options.anchorMode`,
  `Options.defaultAnchorMode` and `outputMode(AnchorMode.X)` work and raise one `FutureWarning`
  each (PopTorch 2.4 renamed them to `OutputMode`, `outputMode`, `defaultOutputMode`).
"""

MODULES_HEAD = """\
## The PopTorch module names (`{opt_in}`)

With `{opt_in}` in a process's environment (`poprun --poptorch-modules` sets
it for every instance; the README's "Run a PopTorch program unchanged"), a PopTorch program or
library runs with no change at all, its own imports included: `import poptorch`, `from poptorch
import ...`, `import poptorch.optim as optim`, `from poptorch._impl import ...`, `import popart`,
`importlib.util.find_spec("poptorch")` and `importlib.metadata.version("poptorch")` all answer,
in any Python process of an environment where the project is installed (a pip-installed wheel or
the editable checkout: both put `popdist-poptorch-modules.pth` in site-packages). Each name is
the project's module itself, so `poptorch.trainingModel is popdist_torch.trainingModel`, and
`isinstance` agrees across the two spellings; no module is loaded twice. `popdist.poptorch` is
the project's always. The names, and the project's module each one is:
"""

MODULES_TAIL = """
Any other `poptorch.X` is the project's `popdist_torch.X` where that module exists, else
`ModuleNotFoundError`, as for any missing module.

- **Off, nothing changes.** Without the variable (or with `0`), `import poptorch` raises
  `ModuleNotFoundError` as before, `find_spec("poptorch")` is `None`, and a Python start costs
  one dictionary look-up more (the `.pth` line reads the variable; it imports nothing:
  `benchmarks/import_cost.py` measures it, docs/import-cost.md).
- **Metadata, never a distribution.** `importlib.metadata.version("poptorch")` is
  `{metadata}` (PopTorch's wheel form, `X.Y.Z+build`), so transformers'
  `require_version("poptorch>=3.3")` passes; `poptorch.__version__` is `{version}`
  (PopTorch's `<release>-<snapshot>` form). The metadata comes from the finder on
  `sys.meta_path` while the variable is set, for a look-up by name: no dist-info is written,
  pip lists and uninstalls nothing, and the project publishes no distribution named
  `poptorch` or `popart`.
- **A real PopTorch wins.** Where a Graphcore `poptorch` (or `popart`) is on `sys.path`, the
  names and the metadata are its own, and the process says so in one line on stderr.
"""

#: The page's sections: heading, a line under it, and which rows it holds.
SECTIONS: tuple[tuple[str, str, tuple[Row, ...]], ...] = (
    ("Top-level names", "", tuple(r for r in NAMES if r.owner == "poptorch" and r.section == MODELS)),
    (
        "`poptorch._impl`",
        "The names libraries take from PopTorch's private module (optimum-graphcore's seq2seq trainer imports the first two when it is imported).",
        tuple(r for r in NAMES if r.owner == "poptorch._impl"),
    ),
    ("Model parallelism", "", tuple(r for r in NAMES if r.section == PARALLEL)),
    ("Operations", "", tuple(r for r in NAMES if r.section == OPS)),
    ("Enumerations", "All have PopTorch's members and values.", tuple(r for r in NAMES if r.section == ENUMS)),
    ("`Options`", "", tuple(r for r in NAMES if r.owner.split(".")[0] == "Options")),
    ("`TensorLocationSettings`", "", tuple(r for r in NAMES if r.owner == "TensorLocationSettings")),
    (
        "`PoplarExecutor` (what `trainingModel` and `inferenceModel` return)",
        "Other attributes are the wrapped module's (`model.train()`, `state_dict()`...).",
        tuple(r for r in NAMES if r.owner == "PoplarExecutor"),
    ),
    (
        "Optimizers (`poptorch.optim`)",
        "Every argument of their constructors, PopTorch's and torch's, takes `None` as its default (`Adam(params, betas=None, eps=None)`), as PopTorch's.",
        tuple(r for r in NAMES if r.owner.startswith("poptorch.optim")),
    ),
    (
        "Optimizer arguments (`poptorch.optim`: `SGD`, `Adam`, `AdamW`, `RMSprop`)",
        "PopTorch's extra arguments of its optimizers; torch's own are torch's. A refused value raises `OptimizerError` (a `ValueError`).",
        tuple(r for r in NAMES if r.owner == "optim"),
    ),
    (
        "Graph operators (`torch.ops.poptorch`)",
        "PopTorch registers these with torch and its helpers call them; some programs call them directly. They are registered here too, with PopTorch's schemas, so eager, traced (`torch.jit.trace`) and scripted (`torch.jit.script`) models run them, inside the executor's `vmap` over replicas too. A refused operator raises when it runs.",
        tuple(r for r in NAMES if r.owner == "torch.ops.poptorch"),
    ),
    (
        "PopART names (`import popdist_torch.popart as popart`)",
        "What PopTorch programs take from `popart`: enumerations for `opts._Popart.set` and a few settings objects. It is not PopART's graph API (`Builder`, sessions).",
        tuple(r for r in NAMES if r.owner == "popart"),
    ),
)  # fmt: skip


def _note(row: Row) -> str:
    if row.status != REFUSED:
        return row.note
    quoted = f'"{row.note}"'
    return f"{row.when_text}: {quoted}" if row.when_text else quoted


def _table(rows: Iterable[Row]) -> list[str]:
    lines = ["| name | status | notes |", "|---|---|---|"]
    lines += [
        f"| `{row.qualified}` | {row.status} | {_note(row)} |".replace("|  |", "| |")
        for row in rows
    ]
    return lines


def _modules() -> list[str]:
    from _popdist_poptorch import METADATA_VERSION, MODULES, VERSION

    rows = [f"- `{name}`: `{target}`" for name, target in MODULES.items()]
    tail = MODULES_TAIL.format(metadata=METADATA_VERSION, version=VERSION)
    return ["", MODULES_HEAD.rstrip().replace("{opt_in}", OPT_IN), "", *rows, tail.rstrip()]


def render() -> str:
    """The whole page, from the table."""
    lines = [INTRO.rstrip().replace("{opt_in}", OPT_IN), *_modules()]
    for heading, line, rows in SECTIONS:
        lines += ["", f"## {heading}", ""]
        if line:
            lines += [line, ""]
        lines += _table(rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Write the page under the repository root given (default: the current directory)."""
    root = Path(argv[0]) if argv else Path()
    (root / PAGE).write_text(render())
    print(f"wrote {root / PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
