"""Generative load: LLM workloads (Azure LLM 2023 and Mooncake trace replay, Poisson and Gamma
with length distributions), an open-loop streaming driver, and TTFT/TPOT goodput reports."""
