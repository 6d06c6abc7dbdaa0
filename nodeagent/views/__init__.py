"""What the verbs compute, below every face: `nodeagentctl` (cli/ctl/) and the API (api/) only
parse their input and render these (text, JSON), so they cannot drift apart.

documents.py (the JSON spellings every face shares: listings, times, events), runs.py (a pool
job's run as one row), jobs.py (the pool's jobs), show.py (one job in full, with its goodput),
history.py (the ended jobs), accounting.py (history beyond the pool's window and `report`, from
the accounting database), fairshare.py (each user's fair share), status.py (a job's status
document, pure), nodes.py (the pool's nodes), queues.py (the pool's queues), logs.py (a rank's
log across the pool, read or followed), stacks.py (a live job's stacks, every node's agent
asked at once), run.py (a command across a job's nodes: its tasks' lines and ends, the
worst), waits.py (what a --wait after a change waits for),
table.py (the verbs, and the API route of each: one
table both faces are held to), allocation.py (an allocation's spec, and its shell's
variables)."""
