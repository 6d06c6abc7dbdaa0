"""GPU health: readings from NVML (or a fake), a pure classifier, a background monitor.

readings.py (what a backend reports), nvml.py (the NVML backend, pynvml), fake.py (FakeNvml:
driven by a file, raising NVML's real errors), kmsg.py (XIDs logged before the agent started,
from /dev/kmsg), classify.py (readings -> a verdict per GPU, pure), policy.py (what the
verdicts mean for this node's part in the job, pure), monitor.py (GpuMonitor: samples in a
background thread, serves cached verdicts), health.py (the agent's view: owns the monitor),
inventory.py (the units a node offers the pool: its healthy GPUs, or their MIG instances),
probe.py (one fresh reading for `nodeagent health`), affinity.py (the CPUs near a GPU: NVML's
masks and the kernel's CPU lists, pure).

Only this package imports pynvml, and only lazily (decision 10: NVML is optional).
"""
