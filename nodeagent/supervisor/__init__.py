"""Every child process of the agent: worker groups, spares, the fence keeper, munge.

group.py (the Supervisor: spawn, watch, release, stop one generation's workers), worker.py (one
worker's record, and what is done to one worker: signals, kills, liveness, its stacks, the
failure its exit makes), release.py (in place: a group released, its survivors parked, a failed
rank's warm-up), status.py (what it reports: GroupPhase, GroupStatus, WorkerExit, Started),
spec.py (what a worker is started with: torchrun's environment, argv, cwd, files), ranklogs.py
(a rank's log files), spares.py (pre-started interpreters, `job.preload`), fence.py (the fence
keeper, `python -m nodeagent.supervisor.fence`), cgroups.py (a containerised worker fenced by
its container's cgroup: what left its process group dies too), jobcgroup.py (a job's cgroup on
the node: its limits, its workers put in it, the OOM kills in it, everything in it ended at the
job's end), jobspace.py (a job's own /dev/shm, in namespaces its user makes, and its temp
directory), deathsig.py (a child the agent starts dies with it), devices.py (the device program
on it: a job's bare workers may open only its GPUs' device nodes), container.py (a worker in the
job's image: the podman service's client, its pulls), errorfile.py (a failed rank's root cause),
libmunge.py (the credentials of the pool's requests, made and checked in process through
libmunge), munge.py (MUNGE's `munge` and `unmunge` programs, where libmunge does not load),
usage.py (what the kernel says a worker got of the CPU: its run time and its wait for one, and
whether it works: a thread of its process tree running or in disk I/O), asuser.py (a short
program run as the job's user: the copies into a submitted job's persistent tier), program.py (a
program of the agent's own, `python -m MODULE FD`, talked to over a socket pair: the pool
leader's requests' serving), foreground.py (a command run here for a user at a terminal:
nodeagentctl alloc's shell), command.py (a command its user runs in a job on this node,
nodeagentctl run's: its signals, its end, its hang-up). Apart from the embedded redis-server
(coord/embedded.py), only this package starts processes.
"""
