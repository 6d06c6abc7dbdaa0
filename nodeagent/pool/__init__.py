"""The pool: many jobs on one set of nodes, the same shape as job/.

Pure decisions: schedule.py (`schedule(view, policy)`, which node serves which job), preempt.py
(shrinking running jobs for a pending one), sharing.py (the nodes jobs asking for GPUs share:
packed best fit), sharetake.py (which shares go to a pending job: shrunk, evicted, reclaimed),
schedrun.py (the round's working state), schedview.py (what it decides
from), riders.py (the nodes whose pool leases lapsed that keep their jobs while those count them
members: a Redis outage ridden through). Executors:
leadership.py (the pool leader's round: read, schedule, commit fenced), member.py (a node's
pool heartbeat), requests.py (pool.auth munge: the pool leader's side of the signed requests),
refusals.py (why a request is refused, and the reply that says it), retries.py (a request that
arrives again answered as it was, and each "done" confirmed on the replicas first),
serving.py (the thread that serves them while the node leads the pool),
tokens.py (API tokens: who a token credential names, minting, revoking), authority.py (who is
who: callers, operators, specs vouched for, who may read a log),
jobverbs.py (when a job may be held, released or requeued: one rule for both sides),
holders.py (an allocation held from a terminal: its holder's lease, cancelled once it lapses),
cordoning.py (cordon, drain, uncordon of a pool node, a pinned one's job included: both sides),
lifecycle.py (what the leader does about ended jobs and time limits), submission.py (what a
submission is checked against, and an array stored one job per task: both sides), notify.py
(the leader telling the operator's endpoints of job changes, from a thread of its own),
ledger.py (the leader taking ended jobs' records into the accounting database, from a thread),
fairness.py (the leader's fair share: usage charged each round, priorities raised by it).
metrics.py: the pool's gauges. What is stored lives in model/pool.py and model/request.py.
"""
