"""popdist_torch: a PopTorch-like data-parallel executor on torch and Horovod."""
