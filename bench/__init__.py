"""Benchmarks: the load generator, the scenarios and the runner (``python bench/run.py``)."""
