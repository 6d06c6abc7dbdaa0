"""The wiring: build the parts from a node's config and run them.

run.py (`run_agent`: Redis, the GPU monitor, the fence keeper, the metrics server, signals),
servechild.py (the pool leader's requests served in a process of its own), tuning.py (the
interpreter's settings for the agent's processes),
locks.py (one agent per node and job: the worker record and its lock), jobrun.py (one job's
agent and what only it uses), nodeloop.py (a pool node's loop: its membership and its job),
pulls.py (a job's image pulled before its workers start), isolation.py (what keeps the jobs
on a node apart, checked at start: its job cgroups and private /dev/shm), joblimits.py (each
job's limits, cgroup, device program, /dev/shm and CPUs, made for its agent), remote.py
(nodeagentctl run's commands: started for the job's user, relayed to them), logins.py (`ssh node`:
a login of a user who holds a job here taken into its cgroup, for sshd's PAM check),
preflight.py and access.py (what only this node can tell about a config), signalwatch.py and
wakeup.py (signals and wake-ups for the loop).
"""
