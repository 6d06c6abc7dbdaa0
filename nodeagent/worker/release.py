"""Let a destroyed process group really close: drop the references torch itself keeps to it.

A worker that re-forms in place destroys its old group and waits for the next assignment. A
peer may still be blocked in a collective with it; gloo only fails that collective once this
rank's connections close, and they close only when the group object is freed. Otherwise the
peer waits out the collective timeout (30 min by default) and the re-form with it.

`dist.destroy_process_group()` drops torch.distributed's own references, but with FSDP2 on
torch 2.13 (gloo, CPU) the old group lived on here, found by following its reference count
after destroy (nothing else in the process referred to it):
- the defaults of `torch.distributed.nn.functional`'s collectives, `group=group.WORLD`,
  evaluated when that module is imported, which torch does lazily at the first custom op
  (FSDP2 and functional collectives run one), so they hold whatever WORLD was then;
- DTensor's caches: sharding propagation (Python, per thread, and C++), redistribution plans
  and transforms, mesh topology. Their entries hold DTensor specs or meshes, and a
  DeviceMesh holds its groups;
- the old generation's FSDP2 modules themselves, until a garbage collection: they sit in
  reference cycles (module, state, hooks), and their parameters' specs hold the mesh.

The caches are emptied and the collection made (0.3 s together with torch loaded here) only
where they can matter: DTensor was imported and the old group's connections are still open
once the defaults are reset. DDP imports DTensor at its first step (torch 2.13) but leaves no
cycle (see elastic._detached): its group is gone as soon as torch drops it, and every re-form
of a DDP job paid those 0.3 s for nothing (the survivors' whole stall after a join was 0.44 s;
tests/integration/test_release.py). Each step is skipped where the torch at hand lacks what it
touches.
Another torch release may keep other references: then the peer waits for the collective
timeout, as it did before (tests/integration/test_elastic_worker.py catches that).

A failed `init_process_group` leaves something behind too: torch names the default group by a
counter (`_world.group_count`, "0" in a fresh process) and counts it before the rendezvous, so
a rank whose init timed out would name its next group "1". Its gloo keys then sit under another
prefix of the store than those of fresh processes, and every later re-form with one of them
times out. `init_rolled_back` puts the counter back when an init fails (found by
bench/goodput.py; tests/integration/test_release.py).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import types
from collections.abc import Collection, Iterator
from typing import Any

from nodeagent.worker.abort import socket_inodes

PACKAGE = "torch.distributed"


def release_destroyed_groups(connections: Collection[int] = ()) -> None:
    """After `destroy_process_group()`: drop torch's own references to the destroyed groups.

    `connections`: the inodes of the destroyed group's sockets (abort.group_sockets), if known;
    when none of them is open any more, the group is gone and the caches are left alone."""
    _reset_group_defaults()
    if f"{PACKAGE}.tensor" not in sys.modules:
        return
    if connections and not set(connections) & set(socket_inodes()):
        return
    _clear_caches()
    gc.collect()


@contextlib.contextmanager
def init_rolled_back() -> Iterator[None]:
    """Around `init_process_group`: if it raises, torch's group counter is as it was before."""
    from torch.distributed import distributed_c10d

    world = getattr(distributed_c10d, "_world", None)
    before = getattr(world, "group_count", None)
    try:
        yield
    except BaseException:
        if world is not None and before is not None:
            world.group_count = before
        raise


def _modules() -> Iterator[types.ModuleType]:
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith(PACKAGE):
            yield module


def _reset_group_defaults() -> None:
    """Set every ProcessGroup default of torch.distributed's module-level functions to None,
    which those functions read as the default group: what they would hold had their module
    been imported before the first group was made."""
    import torch.distributed as dist

    for module in _modules():
        for value in list(vars(module).values()):
            # type(), not isinstance(): a deprecated alias warns when its class is asked
            if type(value) is not types.FunctionType or not value.__defaults__:
                continue
            defaults: tuple[Any, ...] = value.__defaults__
            if any(isinstance(d, dist.ProcessGroup) for d in defaults):
                value.__defaults__ = tuple(
                    None if isinstance(d, dist.ProcessGroup) else d for d in defaults
                )


def _clear_caches() -> None:
    """Empty torch.distributed's caches: every lru_cache its code made (at module or class
    level, nested in a function or one per thread: looked for among all objects, as they are
    many and move between releases), its module-level dicts named as caches, and DTensor's
    native sharding cache."""
    import torch

    caches = [v for v in gc.get_objects() if type(v) is functools._lru_cache_wrapper]
    for cache in caches:
        if str(getattr(cache, "__module__", "")).startswith(PACKAGE):  # its function's module
            cache.cache_clear()
    for module in _modules():
        for name, value in list(vars(module).items()):
            if name.endswith("_cache") and type(value) is dict:
                value.clear()
    clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if callable(clear_native):
        clear_native()
