"""The LLM engine model: continuous batching over a paged KV cache with a prefix cache, and
the step time fitted on published measurements. The emulated engine, the router and the
token-level simulator all run this one model."""
