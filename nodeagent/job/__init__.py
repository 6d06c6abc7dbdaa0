"""The job protocol: how the agents of one job agree on members, ranks and a generation.

Pure decisions: plan.py (the leader's `plan(view, policy, memory)`), commands.py (the operator's
commands read into the record), leaderevents.py (the events the plan appends about the job),
members.py (who may run the next generation and who does), decide.py (one node's `decide(view)`
about its own workers), outcome.py, timeline.py, events.py, repeats.py (a failure that repeats the
one before), slowness.py (which member is slow, and what the policy does about it), suspicion.py
(which nodes a majority of the members hold out as lost before their leases lapse), stalls.py (a
rank every other rank waits on, named by the leader), accrual.py (when a peer's silence is suspect
at the intervals its beats came at: the phi accrual detector), ridethrough.py (whether a member cut
off from Redis may train on, and which lapsed members a leader awaits: the fencing invariant,
written once), resume.py (the record rebuilt from what the members run, when Redis lost it).
Executors: leadership.py (plan, then commit fenced), agent.py (the loop: observe, decide, act, the
only place that executes a decision, with the duties it holds: heartbeat.py (its sync with the
job's state, when the next is due), watchduties.py (what its own watches find, acted on: a rank
failed, the node cordoned, its pace written), leaderduties.py (its part as leader: the lease taken,
plan and commit, the slow-node watch), riding.py (its ride through a Redis outage, begun, followed,
cut short or ended by a renewal) and leaving.py (its own departure: a stop asked, a single job's
end, the LEAVE)), lease.py (self-fencing on this node's clock), watch.py (hangs and GPU health as
findings), progress.py (the node running rank 0 says when each generation trained), speed.py (this
node's ranks' pace, a window at a time), slowwatch.py (the leader's slow-node watch: judge, write
the verdicts, drain), verify.py (what this node may act on, checked against what it knows itself),
peerwatch.py (the members' beats to each other over TCP, in a thread) and peers.py (whom this node
watches, what it reports of them, a held-out leader deposed). port.py: what the agent needs of the
job's shared state and of its workers (Protocols: coord/'s JobStore and the supervisor, or
in-memory fakes in the tests). checkpoints/: the checkpoint protocol (the tiers' duties, the
copies, the hand-over, the restore order). Talks to Redis only through the store it is given
(coord/)."""
