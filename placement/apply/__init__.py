"""Apply: executors that turn a Plan or PlanDiff into running servers (dry-run scripts, NVML,
emulated GPUs, Kubernetes manifests) and the plan rendered into the gateway's config."""
