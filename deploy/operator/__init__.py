"""The operator: YAML in, a serving fleet out, changed live (``headrace up / apply / status / down``).

A controller plans, applies make-before-break through a process runtime and the gateway's live
replica API, keeps its state in a state store, heals, autoscales and serves a small admin API.
"""
