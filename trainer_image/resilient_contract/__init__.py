"""resilient_contract: what the operator and the trainer agree on, and nothing else.

Torch-free, kopf-free, kubernetes-free (import-linter enforces it), so both images import the one
definition of each contract:

- `environment`: the variables the operator injects into every worker pod (`WorkerEnv`).
- `storage`: checkpoint storage behind one `Store` seam (local, `s3://`), the checkpoint layout and the one
  completeness rule (`discover`, `check_step`).
- `lineage`, `progress`: fencing tokens in the root; the launchers' progress reports.
- `dcp_metadata`: reads DCP's `.metadata` with a restricted unpickler (never runs a tenant's code).
- `completion`: the termination message and the completed marker a worker leaves behind.
"""
