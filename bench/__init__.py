"""Reproducible benchmarks: one command each, JSON + markdown results under bench/results/."""
