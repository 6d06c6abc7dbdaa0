"""What the agent tells the outside: Prometheus metrics, the bounded HTTP server, structured
logs, systemd's notify protocol, and rank logs and stacks served to `nodeagentctl logs` and
`stacks`.

metrics.py, checkpoints.py (the checkpoint tiers' metrics), httpd.py (the bounded server, and
the handoff of a longer request to a thread of its own), logs.py, sdnotify.py, logserve.py (a
rank's log over HTTP), stacks.py (a live job's stacks over HTTP: py-spy's dumps of its ranks
here, for its user or an operator), runwire.py (nodeagentctl run's wire: the request, its
frames both ways, one node's stream), loginwire.py (`ssh node`'s PAM check and the agent: a
line each way on the login socket), logtail.py (rank logs on this node).
"""
