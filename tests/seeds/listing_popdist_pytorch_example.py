# Copyright (c) 2021 Graphcore Ltd. All rights reserved.

import torch
import argparse
import popdist_torch as poptorch
import popdist
import popdist.poptorch
import horovod.torch as hvd


def command_line_arguments():
    parser = argparse.ArgumentParser(description='PopDist PyTorch example')
    parser.add_argument(
        '--replicas', type=int, default=1, help='Number of replicas')
    return parser.parse_args()


def init_popdist(args):
    hvd.init()
    args.use_popdist = True
    if popdist.getNumTotalReplicas() != args.replicas:
        print(f"The number of replicas is overridden by PopRun. "
              f"The new value is {popdist.getNumTotalReplicas()}.")
    args.replicas = int(popdist.getNumLocalReplicas())

    args.popdist_rank = popdist.getInstanceIndex()
    args.popdist_size = popdist.getNumInstances()


def create_model(opts):
    if opts.use_popdist:
        model_opts = popdist.poptorch.Options()
    else:
        model_opts = poptorch.Options()

    return model_opts


if __name__ == '__main__':

    opts = command_line_arguments()

    # Initialise PopDist
    if popdist.isPopdistEnvSet():
        init_popdist(opts)
    else:
        opts.use_popdist = False

    create_model(opts)
