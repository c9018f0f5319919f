"""The load generator: seeded arrival processes, open- and closed-loop drivers over KServe v2
HTTP and gRPC, HDR-histogram statistics, SLO/goodput reports and a virtual-time target."""
