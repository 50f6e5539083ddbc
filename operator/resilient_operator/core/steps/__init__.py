"""The steps of one reconcile, in the order core/reconcile.py runs them. Each writes its own status fields,
conditions and events into the shared `Draft`; none imports another (.importlinter)."""
