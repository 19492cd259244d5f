# Lightning's "Accelerator: IPU training" page, listing 2, as written; imports changed
# (popdist_torch as poptorch, lightning.pytorch, IPUStrategy from popdist_lightning, and the
# Trainer the listing uses without importing) and MyLightningModule from listing_support.
import lightning.pytorch as pl  # noqa: F401 - the listing's import
from lightning.pytorch import Trainer
from listing_support import MyLightningModule

import popdist_torch as poptorch
from popdist_lightning import IPUStrategy

model = MyLightningModule()

inference_opts = poptorch.Options()
inference_opts.deviceIterations(32)

training_opts = poptorch.Options()
training_opts.anchorMode(poptorch.AnchorMode.All)
training_opts.deviceIterations(32)

trainer = Trainer(
    accelerator="ipu",
    devices=8,
    strategy=IPUStrategy(inference_opts=inference_opts, training_opts=training_opts),
)
trainer.fit(model)
