"""Operator-facing deployment: the Triton launcher and model-repository writer, the operator
YAML (ModelDeployment, GpuPool) and the reconciler that makes a fleet match it."""
