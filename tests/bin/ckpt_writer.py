"""Save a large checkpoint over and over; print ``saved <version>`` after each complete save.

Used by tests/unit/test_checkpoint.py to SIGKILL a save half-way through.
"""

from __future__ import annotations

import sys

import torch

from popdist_torch.checkpoint import save_checkpoint


def main() -> None:
    path, numel = sys.argv[1], int(sys.argv[2])
    model = torch.nn.Linear(1, 1, bias=False)
    for version in range(1_000_000):
        blob = torch.full((numel,), float(version))
        save_checkpoint(path, model=model, step=version, extra={"blob": blob, "version": version})
        print(f"saved {version}", flush=True)


if __name__ == "__main__":
    main()
