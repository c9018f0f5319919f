"""Token-level routing of generative requests: sans-IO routers, the same objects in the gateway
(:mod:`gateway.llm.relay`) and the token-level simulator (:mod:`loadgen.llm.sim`).

- :mod:`.types`: the vocabulary (requests, decisions, replicas) and :class:`~.types.RouterBase`,
  the accounting every router keeps;
- :mod:`.router`: headrace's router, on predicted TTFT/TPOT from the engine model, with flow
  control (:mod:`.flow`) and a prefix index (:mod:`.prefix`);
- :mod:`.baselines`: the routers in use elsewhere, each as its documentation and code describe it.
"""
