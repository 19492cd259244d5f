# Lightning's "Accelerator: IPU training" page, listing 4 (Block contexts in forward), as
# written; imports changed (lightning.pytorch, popdist_torch as poptorch, IPUStrategy from
# popdist_lightning, and torch, which the listing uses without importing). The listing's
# "..." is where the reader's steps go: they come from listing_support.
import lightning.pytorch as pl
import listing_support
import torch

import popdist_torch as poptorch
from popdist_lightning import IPUStrategy


class MyLightningModule(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer1 = torch.nn.Linear(5, 10)
        self.layer2 = torch.nn.Linear(10, 5)
        self.layer3 = torch.nn.Linear(5, 5)
        self.layer4 = torch.nn.Linear(5, 5)

        self.act = torch.nn.ReLU()
        self.softmax = torch.nn.Softmax(dim=1)

    def forward(self, x):
        # Explicit layers on a certain IPU
        with poptorch.Block(ipu_id=0):
            x = self.act(self.layer1(x))

        with poptorch.Block(ipu_id=1):
            x = self.act(self.layer2(x))

        with poptorch.Block(ipu_id=2):
            x = self.act(self.layer3(x))
            x = self.act(self.layer4(x))

        with poptorch.Block(ipu_id=3):
            x = self.softmax(x)
        return x

    # ... (the listing's ellipsis: the reader's steps)
    training_step = listing_support.training_step
    configure_optimizers = listing_support.configure_optimizers
    train_dataloader = listing_support.train_dataloader
    on_fit_start = listing_support.on_fit_start
    on_train_epoch_end = listing_support.on_train_epoch_end
    on_fit_end = listing_support.on_fit_end


model = MyLightningModule()
trainer = pl.Trainer(accelerator="ipu", devices=8, strategy=IPUStrategy(device_iterations=20))
trainer.fit(model)
