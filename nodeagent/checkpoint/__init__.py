"""The agent's side of the checkpoint tiers: one job's memory tier on this node, which the agent
owns (it makes it, verifies it, copies it to the persistent tier and removes it), and what the
workers say they restored. `keeper.py` (TierKeeper, polled by the agent's loop; the slow parts
in a thread of its own), `scan.py` (verification, copies, pruning). The format is
nodeagent.channel.tier's; what goes into Redis is nodeagent.model.tiers'.
"""
