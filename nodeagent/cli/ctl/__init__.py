"""`nodeagentctl`, laid out as pip lays out its commands: one module per verb, one table.

nodeagentctl.py (`main`: parse, dispatch, exit codes; nodeagentctl's documentation;
__main__.py runs it for `python -m nodeagent.cli.ctl`), verbs.py (the table of verbs, name ->
module, and the shape every verb's module has), parser.py (the global options, then every
verb's arguments).

The verbs, a module each: status.py, scale.py, events.py, restart.py, stop.py, cordon.py,
drain.py, uncordon.py, health.py, logs.py, stacks.py (what a live job's ranks are doing) (a
job's own); submit.py, alloc.py (nodes held for your own shell, as salloc), run.py (a command across
them, as srun), jobs.py, nodes.py,
cancel.py, holding.py (hold, release, requeue: one shape, an object each), show.py, history.py,
report.py (usage from the accounting database), share.py (fair share), queue.py (the pool's);
token.py (API tokens: mint, list, revoke); ui.py (a one-time link that signs a browser in to the
web UI).

What verbs share: targets.py (the Redis, prefix, pool and job a command acts on), argtypes.py
(argument checks), rc.py (nodeagentctl's own defaults file), caller.py (who runs it), checks.py
(a job and a node exist), cordons.py (cordon, drain, uncordon), runs.py (a pool job's run as a
row), output.py (printing), wait.py (--wait), signing.py (a signed request sent and answered),
accounting.py (the accounting database history and report read).

To add a verb: write its module (HELP, add_arguments, run, and request if it changes the
pool) and add its row to verbs.py.
"""

from nodeagent.cli.ctl.nodeagentctl import main

__all__ = ["main"]
