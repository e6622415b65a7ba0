"""Planning a run before it starts, on any host.

Compiling the real train step for a TPU slice with the TPU compiler (tpu_compile), the devices' peak
FLOP/s and memory (hardware), the pre-launch estimate's memory model (memory), compiler check and
--fit search (fit) and printout (estimate_report), and the paper's ablation studies (study/).
"""
