"""The agent's side of the checkpoint tiers: one job's memory tier on this node, which the agent
owns (it makes it, verifies it, copies it to the persistent tier and removes it), the copies of
its saves on peers, and what the workers say they restored.

keeper.py (TierKeeper, polled by the agent's loop; the slow parts in a thread of its own),
scan.py (verification, copies, pruning), space.py (room for the tier, its owner mark, the sweep
of tiers this node no longer serves), wire.py (the replica protocol's wire format),
transport.py (the listener: copies of peers' saves taken, fetches served), sender.py (a copy
sent, a save fetched), peerauth.py (how peers on the checkpoint plane prove they are agents:
MUNGE), replicas.py (Replicas: a job's replica area on this node, its listener and the copies
it makes), persistcopy.py (a submitted job's copies to its persistent tier, made by a
program run as the job's user). The formats are nodeagent.channel's (tier, manifests,
restore); what goes into Redis is nodeagent.model.tiers'.
"""
