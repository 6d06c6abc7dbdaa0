"""Benchmarks: scripts that print figures and write bench/results/*.json."""
