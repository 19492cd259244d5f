"""Train with a checkpoint after every step, resuming after poprun relaunches the job:
``elastic_train.py DIR [STEPS [PAUSE_S [CKPT]]]``.

Each step's samples are known by their dataset index (the dataset's third tensor): every
instance appends ``STEP GENERATION INDEX,INDEX,...`` for each step it trained to
``DIR/log/<instance>.g<generation>`` (``POPDIST_GENERATION``, 0 without it), so a test can
take, for every step, the newest generation's samples and compare their multiset with an
uninterrupted run's. ``PAUSE_S`` (default 0.3) after each step paces the run so a fault can
land in its middle; while ``DIR/hold`` exists the run waits after each step (a test holds the
job until something outside it has happened: Slurm declaring a node down). At poprun's
save-now notice (``popdist.should_stop()``, after the step's checkpoint) it stops there and
prints ``STOPPED``. At the end each instance writes its weights to ``DIR/final.<instance>.pt``
and prints ``OK <instance> <generation> <instances>``.

Checkpoints: ``CKPT`` (default ``DIR/ckpt.pt``), one copy per host unless the hosts share
the file (:mod:`popdist_torch.host_copies`); the resume takes the newest copy any host has. A
job resumed on another topology (fewer instances, more replicas each) must find the same data
order: the DataLoader's position is topology-invariant.

``ELASTIC_SELF_SIGNAL=INSTANCE:STEP:SIGNUM`` in the environment: that instance sends itself
signal SIGNUM (``os.kill``) once it logged step STEP, in generation 0 only (a program that
crashes by itself, as a SIGSEGV does).

Phases: each instance writes ``DIR/phases/<instance>.g<generation>``, one ``NAME WALL_TIME``
line per moment of its start (its launcher's start: Open MPI's daemon, or mpirun on the
launch host; its own process; its imports; ``popdist.init()``; the resume; its first step),
so ``benchmarks/elastic.py`` can say where a relaunch's time goes.
"""

from __future__ import annotations

import time

PHASES: list[tuple[str, float]] = [("script", time.time())]  # before the imports

import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

import popdist  # noqa: E402
import popdist.poptorch  # noqa: E402
import popdist_torch as poptorch  # noqa: E402
from popdist_torch.checkpoint import resume_checkpoint, save_checkpoint  # noqa: E402

PHASES.append(("imported", time.time()))

BATCH = 2  # per replica; 6 replicas, one device iteration: 12 samples a step


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.body(x)
        return out, nn.functional.mse_loss(out, y)


def _started(pid: int) -> float | None:
    """When process ``pid`` started, in wall-clock seconds (from its age since boot)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(stat[19]) / os.sysconf("SC_CLK_TCK")
    return time.time() - age


def _launcher() -> tuple[str, float | None]:
    """The nearest ancestor that is Open MPI's daemon or mpirun, and when it started."""
    pid = os.getpid()
    for _ in range(6):
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError):
            break
        if name in ("orted", "mpirun", "orterun"):
            return name, _started(pid)
    return "launcher", None


def write_phases(directory: Path, instance: int, generation: int) -> None:
    name, launcher = _launcher()
    moments = [(name, launcher), ("process", _started(os.getpid())), *PHASES]
    (directory / "phases").mkdir(exist_ok=True)
    text = "".join(f"{what} {at:.3f}\n" for what, at in moments if at is not None)
    (directory / "phases" / f"{instance}.g{generation}").write_text(text)


def main() -> None:
    directory = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
    ckpt = Path(sys.argv[4]) if len(sys.argv) > 4 else directory / "ckpt.pt"
    generation = int(os.environ.get("POPDIST_GENERATION", "0") or 0)
    self_signal = [int(v) for v in os.environ.get("ELASTIC_SELF_SIGNAL", "").split(":") if v]
    popdist.init()
    PHASES.append(("init", time.time()))
    torch.manual_seed(0)
    model = Net()
    opts = popdist.poptorch.Options()
    opts.randomSeed(42)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(123)
    x = torch.randn(96, 4, generator=gen)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin(), torch.arange(96))
    loader = poptorch.DataLoader(
        opts, data, batch_size=BATCH, shuffle=True, order="topology_invariant"
    )
    start = resume_checkpoint(ckpt, model=model, optimizer=optimizer, dataloader=loader)
    PHASES.append(("resumed", time.time()))
    instance = popdist.getInstanceIndex()
    print(f"START {instance} g{generation} step {start}", flush=True)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    log_dir = directory / "log"
    log_dir.mkdir(exist_ok=True)
    log = open(log_dir / f"{instance}.g{generation}", "a")  # noqa: SIM115
    stream = iter(())
    step = start
    while step < steps:
        try:
            x, y, index = next(stream)  # type: ignore[call-overload]
        except StopIteration:
            stream = iter(loader)  # every pass is a new epoch
            continue
        training(x, y, index)
        step += 1
        log.write(f"{step} {generation} {','.join(map(str, index.tolist()))}\n")
        log.flush()
        if generation == 0 and self_signal[:2] == [instance, step]:
            os.kill(os.getpid(), self_signal[2])
        if step == start + 1:
            PHASES.append(("step", time.time()))
            write_phases(directory, instance, generation)
        save_checkpoint(ckpt, model=training, optimizer=optimizer, step=step, dataloader=loader)
        if popdist.should_stop():  # poprun's save-now notice (here: to readmit a host)
            print(f"STOPPED {instance} g{generation} step {step}", flush=True)
            return
        time.sleep(pause)
        while (directory / "hold").exists():
            time.sleep(0.05)
    torch.save(model.state_dict(), directory / f"final.{instance}.pt")
    print(f"OK {instance} {generation} {popdist.getNumInstances()}", flush=True)


if __name__ == "__main__":
    main()
