"""resilient_trainer: the trainer side of resilient-training.

The modules `contract`, `layout` and `dcp_metadata` are torch-free: the operator imports them, so the
checkpoint layout and the injected environment have exactly one definition. Everything that needs torch
lives in other modules and is imported explicitly by training scripts.
"""
