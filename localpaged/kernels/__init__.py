"""Paged-attention kernels.

``reference`` holds the plain-torch versions (the CPU path and the ground truth); ``triton_ops``
holds the Triton versions with the same names and signatures. Nothing is imported here so that
the CPU path never needs Triton: import the submodule you want.
"""
