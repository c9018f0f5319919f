"""Real vLLM on CPU serving a tiny Llama with random weights: the reference engine the LLM engine
model is checked against, as real Triton is for the KServe path. Opt-in, outside CI (a 3.5 GB
venv, minutes to start on 2 cores):

    bench/vllm_cpu/install.sh                                   # .venv-vllm, once
    .venv/bin/python -m pytest -m vllm --run-vllm tests/vllm    # the API, metrics and errors
    .venv/bin/python -m bench.vllm_cpu.measure                  # the CPU profile, measured
    .venv/bin/python -m bench.llm_engine_fidelity --part vllm   # the engine model against it
"""
