# Copyright (c) 2021 Graphcore Ltd. All rights reserved.

import torch
import popdist_torch as poptorch
import popdist
import horovod.torch as hvd

hvd.init()
