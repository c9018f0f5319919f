"""The load generator: seeded arrival processes, open- and closed-loop drivers over KServe v2
HTTP and gRPC, HDR-histogram statistics, SLO/goodput reports and a virtual-time target."""

import gateway as _gateway  # noqa: F401  (installs the compiled core's finder: gateway/compiled.py)
