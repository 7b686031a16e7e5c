"""Benchmarks, timed the way OSU micro-benchmarks and nccl-tests time things."""
