"""Modules shared by the training examples (examples/moe_flax, examples/dense_fsdp).

`launch` (process setup, no JAX), `comm` (the one seam to the collectives and their byte
accounting), `model`, `fsdp`, `data`, `trainer`. Each example's train.py registers this package
as `common` by its path (no sys.path edit) and imports from it.
"""
