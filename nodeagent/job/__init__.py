"""The job protocol: how the agents of one job agree on members, ranks and a generation.

Pure decisions: plan.py (the leader's `plan(view, policy, memory)`), decide.py (one node's
`decide(view)` about its own workers), outcome.py, timeline.py, events.py. Executors:
leadership.py (plan, then commit fenced), agent.py (the loop: observe, decide, act, the only
place that executes a decision), lease.py (self-fencing on this node's clock), watch.py (hangs
and GPU health as findings). Talks to Redis only through the store it is given (coord/).
"""
