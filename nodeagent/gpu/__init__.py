"""GPU health: readings from NVML (or a fake), a pure classifier, a background monitor.

Only this package imports pynvml, and only lazily (decision 10: NVML is optional).
"""
