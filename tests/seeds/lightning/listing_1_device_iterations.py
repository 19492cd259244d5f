# Lightning's "Accelerator: IPU training" page, listing 1, as written; imports changed
# (lightning.pytorch, IPUStrategy from popdist_lightning) and MyLightningModule, which the
# listing leaves undefined, imported from listing_support.
import lightning.pytorch as pl
from listing_support import MyLightningModule

from popdist_lightning import IPUStrategy

model = MyLightningModule()
trainer = pl.Trainer(accelerator="ipu", devices=8, strategy=IPUStrategy(device_iterations=32))
trainer.fit(model)
