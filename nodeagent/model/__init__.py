"""What goes into Redis and comes back: records, reports, specs, and the strict decoder.

job.py (a job's node reports, record, events, commands), stalls.py (ranks silent past their
step times as a report lists them, the ranks the leader names waited on), pool.py (a pool's
node reports and job statuses), gpus.py (the GPU units a node offers, what a job asks of them),
queues.py (the pool's queues), spec.py (a submitted job spec), array.py (job arrays),
notify.py (what a submitter is told of), depend.py (its dependencies), accounting.py (an ended
job's accounting record), fairshare.py (fair share: decayed usage, shares, the factor),
history.py (a job's generations and restarts from its events), tiers.py (what a node holds in
its checkpoint tiers, the leader's restore order and committed step), handout.py (a node's share
of the checkpoint copies), request.py (a signed request to change the pool, its reply, its
caller), credential.py (a MUNGE credential bound to a request, and the verdict on it), token.py
(API tokens: their claims, secret, a request's token credential and the verdict on it),
garbage.py (what was found in Redis that nodeagent did not write), goodput.py (where a job's
wall time went, from its events: `nodeagentctl show`, the leader's metrics, the pool's ended
jobs), speed.py (a node's pace over a window, the leader's verdict on a slow node), resources.py
(what a job may use on a node beside its GPUs: memory, processes, CPU weight), cores.py (a
node's cores divided between its GPU units: a sharing job's cpuset), decode.py
(the strict reader all of them use). Pure: no Redis here (coord/ reads and writes these)."""
