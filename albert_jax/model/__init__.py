"""The ALBERT model and the sharding rules of its parameters.

Embeddings, the attention core, the shared encoder, the pretraining heads, and the logical-axis
rules that place parameters and batches on a mesh. Imports only the ground layer (base/).
"""
