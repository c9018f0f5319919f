"""The Ray mode: the operator's deployment on a Ray cluster (Triton servers, gateways and the
controller as Ray actors pinned by custom resources), and a ``serve deploy`` config for it."""
