"""Generative load: LLM workloads (Azure LLM 2023 and Mooncake replay, synthetic, llm-d's shared
prefix), an open-loop streaming driver, the token-level simulator, and TTFT/TPOT goodput reports."""
