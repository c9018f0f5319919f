"""Triton on this machine: the tritonserver launcher, model-repository writer, where a variant's
model comes from, and the child processes headrace starts and stops by process group."""
