"""The virtual-time simulator: it drives the gateway's own policy core with a heap of events,
over one replica set or a whole planned fleet, and reports what each request met."""

from profiles import compiled

# the event loop and the runs that feed it, built by ``headrace compile``
COMPILED = compiled.declare(__name__, ("simulator", "run"))
