"""Planning a run before it starts, on any host.

Compiling the real train step for a TPU slice with the TPU compiler, and the devices' peak
FLOP/s and memory that the estimates use.
"""
