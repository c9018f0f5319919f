"""A decode worker process of the front door (``python -m gateway.frontdoor``, started by
:class:`~gateway.frontdoor.decodepool.DecodePool`): it serves the decode and encode jobs of
:data:`~gateway.frontdoor.decode.WORKER_OPS` over its stdin and stdout until stdin closes. Its
errors are the package's own classes, which the pool maps back to answers."""

from __future__ import annotations

from gateway.frontdoor import decodepool
from gateway.frontdoor.decode import WORKER_OPS

decodepool.serve(WORKER_OPS)
