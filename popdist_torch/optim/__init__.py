"""PopTorch's optimizers (``poptorch.optim``): SGD, Adam, AdamW, RMSprop and LAMB.

SGD, Adam, AdamW and RMSprop are subclasses of their torch namesakes, so schedulers,
``state_dict`` and user code treat them as torch's; LAMB is a ``torch.optim.Optimizer``.
PopTorch's arguments, with PopTorch's defaults (each is a row of the surface table,
:mod:`popdist_torch.surface.names`, owner ``optim``):

- ``accum_type`` (type of the gradients the update reads), ``velocity_accum_type`` (SGD),
  ``first_order_momentum_accum_type``, ``second_order_momentum_accum_type``: the types the
  update computes in and the state is stored in, ``torch.float32`` by default, so a model
  cast to ``half()`` keeps float32 optimizer state and a float32 update
  (:mod:`popdist_torch.optim.base`). ``torch.float16`` stores that state in float16
  (the update still computes in float32).
- ``loss_scaling`` (1.0): the executor multiplies the loss by it before the backward pass
  and the optimizer divides the gradients by it before the update, so float16 gradients do
  not flush to zero; ``optimizer.loss_scaling`` reads and sets it.
- ``max_grad_norm`` (``inf``): gradients of all parameters are clipped to this global L2
  norm before each update (after unscaling).
- ``velocity_scaling`` (SGD): PopTorch keeps the velocity multiplied by it; the float32
  velocity kept here needs no scaling, so the value is checked and kept in each param
  group and changes nothing. ``use_combined_accum`` (SGD): PopTorch's two SGD variants
  compute the same update; both values are accepted.
- ``bias_correction`` (AdamW, LAMB; ``True``): ``False`` drops Adam's ``1/(1-beta^t)``.
- ``use_tf_variant`` (RMSprop; ``False``): ``True`` runs TensorFlow's RMSprop.
- ``max_weight_norm`` (LAMB; 65500): the cap of LAMB's weight norm in its trust ratio.
"""

from popdist_torch.optim.attributes import VariableAttributes, check_constants
from popdist_torch.optim.base import PopTorchOptimizer, loss_scaling_of
from popdist_torch.optim.lamb import LAMB
from popdist_torch.optim.optimizers import SGD, Adam, AdamW, RMSprop

#: PopTorch's name of the base class of its optimizers: ``isinstance(opt, poptorch.optim.Optimizer)``.
Optimizer = PopTorchOptimizer

__all__ = [
    "LAMB",
    "SGD",
    "Adam",
    "AdamW",
    "Optimizer",
    "PopTorchOptimizer",
    "RMSprop",
    "VariableAttributes",
    "check_constants",
    "loss_scaling_of",
]
