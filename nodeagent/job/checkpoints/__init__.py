"""The job's checkpoint protocol: how the agents of one job keep a whole step of its training
state in memory across faults (docs/checkpoints.md).

Pure decisions: restore.py (the leader's restore order: which step, from which tier, for the
next generation), replication.py (the ring of nodes and the copies each save needs: what is
whole, what is committed, who sends what to whom, what a restore fetches), lag.py (whether
the copies keep up with the saves: replication_behind's verdict). Executors:
handouts.py (Handouts: the leader plans every node's share of the copies and writes it
fenced), tierduties.py (TierDuties: the agent's loop's duties about its tiers, around the
node's TierKeeper), replicaduties.py (ReplicaDuties: this node's share of the copies, its
listener's checks, the restore's fetches), handover.py (Handover: a node that leaves hands its
stop save to its successors), dialling.py (Dialling: only the listeners the members report are
dialled). Talks to Redis only through the job's store (job/port.py).
"""
