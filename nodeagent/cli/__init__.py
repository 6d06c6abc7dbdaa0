"""Command-line entry points: the only modules that print or choose exit codes.

daemon.py (`nodeagent run`, `config check`, `health`), launch.py and launchargs.py (`nodeagent
launch`: torchrun's flags, an embedded Redis), nodehealth.py (`nodeagent health`: one node's GPU
preflight), status.py (a job's status as a plain document, what `nodeagentctl status --json`
prints), and ctl/ (`nodeagentctl`: one module per verb, one table).
"""
