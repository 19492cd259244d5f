"""Keep the cyclic garbage collector off the heap that the imports built.

torch, Horovod and Lightning leave hundreds of thousands of objects behind their imports:
modules, functions, operator overloads. They live as long as the process, yet every full
collection walks them again (about 0.1 s of CPU each on a 2-core EPYC), and the interpreter's
shutdown walks them more than once: about 0.4 s of an instance's exit went there.
:func:`freeze_imports` moves everything the collector tracks at that moment into its
permanent generation (:func:`gc.freeze`), so later collections skip it. Objects made
afterwards (the model, the data, the training state) are collected as before; the frozen ones
are still freed by reference counting and finalised at shutdown as usual.

One thing changes for the process: :func:`gc.get_referrers` does not look into the permanent
generation, so it no longer finds a referrer that was frozen (a module's namespace, say).

It is called where a framework has just been loaded: at the end of ``import popdist_torch``
and ``import popdist_lightning``, and once :func:`popdist.init` started its backend.
"""

from __future__ import annotations

import gc


def freeze_imports() -> None:
    """Move every object the cyclic collector tracks now to its permanent generation."""
    gc.freeze()
