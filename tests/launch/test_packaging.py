"""Light imports, checked in a fresh interpreter: poprun and popdist never pull in torch,
Horovod or numpy when imported (poprun must start fast; a script pays for torch only when
it uses the executor)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.launch


@pytest.mark.parametrize("module", ["popdist", "popdist.env", "poprun"])
def test_light_modules_do_not_import_torch_or_horovod(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'horovod', 'numpy'}); "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing {module} pulled in {out.stdout.strip()}"
