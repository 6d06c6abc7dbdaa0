"""What the agent tells the outside: Prometheus metrics, the bounded HTTP server, structured
logs, systemd's notify protocol, and rank logs served to `nodeagentctl logs`.

metrics.py, checkpoints.py (the checkpoint tiers' metrics), httpd.py, logs.py, sdnotify.py,
logserve.py (a rank's log over HTTP), logtail.py (rank logs on this node).
"""
