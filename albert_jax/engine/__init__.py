"""The training engine: what any objective trains with.

The train state built from the model, inputs and frozen parameters its caller gives, the jitted
step, the loop with its Hooks, LAMB and the optimizer, checkpoints, the workdir's checks, metrics and
trackers, and compiling (lower, compile, memory and cost analysis). It knows nothing of pretraining
data preparation, fine-tuning tasks, interop or the commands.
"""
