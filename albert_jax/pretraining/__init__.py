"""The pretraining application: its objective (MLM with SOP, NSP or no sentence task), the job that
prepares the data and trains on the engine's loop, the fill-mask glimpse, and init_from's wiring.
"""
