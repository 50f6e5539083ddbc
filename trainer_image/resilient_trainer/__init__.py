"""resilient_trainer: the trainer side of resilient-training.

The contracts it shares with the operator live in `resilient_contract` (torch-free: the operator imports it), so
the checkpoint layout and the injected environment have exactly one definition. Everything that needs torch
lives in other modules and is imported explicitly by training scripts.
"""
