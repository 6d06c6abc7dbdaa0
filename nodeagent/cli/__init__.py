"""Command-line entry points: the only modules that print or choose exit codes.

daemon.py (`nodeagent run`, `config check`, `health`), launch.py and launchargs.py (`nodeagent
launch`: torchrun's flags, an embedded Redis), nodehealth.py (`nodeagent health`: one node's GPU
preflight), pamadopt.py (sshd's PAM check, run by pam_exec: a login only into a job of the
user's on this node), api.py (`nodeagent api`: the HTTP API service, nodeagent/api/),
and ctl/ (`nodeagentctl`: one module per verb, one table).
"""
