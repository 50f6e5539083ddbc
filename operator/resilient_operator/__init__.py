"""resilient_operator: keeps multi-node PyTorch jobs alive through node loss.

Layout: `core/` decides (pure functions of observed state, no Kubernetes client, no kopf);
`constants` names every label, annotation, condition and reason once. The kopf handlers and the
single module that talks to the API live beside them and only observe, call the core, and apply.
"""
