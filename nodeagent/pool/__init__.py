"""The pool: many jobs on one set of nodes. model.py (what is stored), schedule.py (the pure
decision), leader.py (the pool leader's executor), member.py (a node's part)."""
