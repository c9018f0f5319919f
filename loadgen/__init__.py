"""The load generator: seeded arrival processes, open- and closed-loop drivers over KServe v2
HTTP and gRPC, HDR-histogram statistics, SLO/goodput reports and a virtual-time target."""

from profiles import compiled

# the statistics every simulated request is recorded in, built by ``headrace compile``
COMPILED = compiled.declare(__name__, ("stats",))
