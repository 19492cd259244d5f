# Lightning's "Accelerator: IPU training" page, listing 3 (model parallelism with
# BeginBlock), as written; imports changed (lightning.pytorch, popdist_torch as poptorch,
# IPUStrategy from popdist_lightning, and torch, which the listing uses without importing).
# The listing's "..." is where the reader's steps go: they come from listing_support.
import lightning.pytorch as pl
import listing_support
import torch

import popdist_torch as poptorch
from popdist_lightning import IPUStrategy


class MyLightningModule(pl.LightningModule):
    def __init__(self):
        super().__init__()
        # This will place layer1, layer2+layer3, layer4, softmax on different IPUs at runtime.
        # BeginBlock will start a new id for all layers within this block
        self.layer1 = poptorch.BeginBlock(torch.nn.Linear(5, 10), ipu_id=0)

        # This layer starts a new block,
        # adding subsequent layers to this current block at runtime
        # till the next block has been declared
        self.layer2 = poptorch.BeginBlock(torch.nn.Linear(10, 5), ipu_id=1)
        self.layer3 = torch.nn.Linear(5, 5)

        # Create new blocks
        self.layer4 = poptorch.BeginBlock(torch.nn.Linear(5, 5), ipu_id=2)
        self.softmax = poptorch.BeginBlock(torch.nn.Softmax(dim=1), ipu_id=3)

    # ... (the listing's ellipsis: the reader's forward and steps)
    forward = listing_support.forward_through_layers
    training_step = listing_support.training_step
    configure_optimizers = listing_support.configure_optimizers
    train_dataloader = listing_support.train_dataloader
    on_fit_start = listing_support.on_fit_start
    on_train_epoch_end = listing_support.on_train_epoch_end
    on_fit_end = listing_support.on_fit_end


model = MyLightningModule()
trainer = pl.Trainer(accelerator="ipu", devices=8, strategy=IPUStrategy(device_iterations=20))
trainer.fit(model)
