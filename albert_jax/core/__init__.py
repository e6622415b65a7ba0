"""The model and training core that every command builds on.

The config schema, the ALBERT model, LAMB, the train state, meshes and shardings, the training
loop, checkpoints, the workdir, metrics, multi-host set-up and the file layer.
"""
