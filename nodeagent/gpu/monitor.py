"""GpuMonitor: samples the backend in a background thread and serves cached verdicts.

A heartbeat or a scrape never calls NVML: they read the last snapshot, so a wedged GPU cannot
stall the agent. XIDs come from two places: NVML's event set (a thread of its own, blocking up
to 5 s at a time) for XIDs raised from now on, and one scan of the kernel log at start for
XIDs raised before the agent started.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from nodeagent.gpu import kmsg
from nodeagent.gpu.classify import APPLICATION_XIDS, Thresholds, Verdict, classify
from nodeagent.gpu.nvml import GpuUnavailable, NvmlBackend
from nodeagent.gpu.readings import GpuSnapshot

log = logging.getLogger(__name__)
XID_WAIT_S = 5.0
XID_LOG = 1024  # the XIDs kept for readers that have not seen them yet


class GpuMonitor:
    def __init__(
        self,
        backend: NvmlBackend | None,
        interval_s: float,
        thresholds: Thresholds,
        kernel_log: Callable[[], list[str]] = kmsg.read_kmsg,
        unavailable_reason: str = "GPU monitoring is off",
    ) -> None:
        self._backend = backend
        self._interval = interval_s
        self._thresholds = thresholds
        self._kernel_log = kernel_log
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._snapshot = GpuSnapshot(available=False, reason=unavailable_reason)
        self._verdicts: tuple[Verdict, ...] = ()
        self._xids: dict[int, list[int]] = {}
        self._new_xids: list[tuple[int, int]] = []  # the last XID_LOG seen, oldest first
        self._xids_seen = 0  # how many were ever seen: each reader's cursor counts up to it
        self._xid_counts: dict[tuple[int, int], int] = {}
        self.on_change: Callable[[], None] = lambda: None  # e.g. wake the agent's loop

    def start(self) -> GpuSnapshot:
        """Open the backend and take the first sample (synchronously); start the threads."""
        if self._backend is None:
            return self._snapshot
        try:
            count = self._backend.open()
        except GpuUnavailable as exc:
            self._snapshot = GpuSnapshot(available=False, reason=str(exc))
            log.warning("GPU monitoring unavailable: %s", exc)
            return self._snapshot
        log.info("GPU monitoring: %d GPUs", count)
        self.sample()
        self._scan_kernel_log()
        for target, name in ((self._sample_loop, "gpu-sampler"), (self._xid_loop, "gpu-xids")):
            threading.Thread(target=target, name=name, daemon=True).start()
        return self.snapshot()

    def stop(self) -> None:
        self._stopped.set()
        if self._backend is not None and self._snapshot.available:
            self._backend.close()

    def snapshot(self) -> GpuSnapshot:
        with self._lock:
            return self._snapshot

    def verdicts(self) -> tuple[Verdict, ...]:
        with self._lock:
            return self._verdicts

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """How many times each (GPU, XID) was seen since the agent started (NVML events)."""
        with self._lock:
            return dict(self._xid_counts)

    def xids_since(self, seen: int) -> tuple[list[tuple[int, int]], int]:
        """(GPU index, XID) pairs seen after the first `seen`, and the cursor to pass next: each
        job a node serves acts on each XID once (NodeHealth keeps its own cursor)."""
        with self._lock:
            total, kept = self._xids_seen, self._new_xids
            missed = total - max(seen, total - len(kept))
            return kept[len(kept) - missed :] if missed > 0 else [], total

    def xid_cursor(self) -> int:
        """The cursor of a reader that has seen every XID so far (xids_since)."""
        with self._lock:
            return self._xids_seen

    def clear_xids(self) -> None:
        """Forget past XIDs (after an operator uncordons: they were dealt with). Recomputes the
        verdicts from the cached readings: no NVML call on the caller's thread."""
        with self._lock:
            self._xids.clear()
            gpus = tuple(replace(r, xids=()) for r in self._snapshot.gpus)
            self._snapshot = replace(self._snapshot, gpus=gpus)
            self._verdicts = tuple(classify(r, self._thresholds) for r in gpus)

    def sample(self) -> None:
        assert self._backend is not None
        readings = self._backend.sample()
        with self._lock:
            readings = tuple(replace(r, xids=tuple(self._xids.get(r.index, ()))) for r in readings)
            self._snapshot = GpuSnapshot(available=True, gpus=readings)
            verdicts = tuple(classify(r, self._thresholds) for r in readings)
            changed = verdicts != self._verdicts
            self._verdicts = verdicts
        if changed:
            self.on_change()

    def _record_xid(self, index: int, xid: int) -> None:
        """Every XID is acted on once by each job the node serves (xids_since: each its own
        cursor); only those that say something about
        the GPU itself stay in its verdict. An application-level XID is over once the
        workers restart."""
        with self._lock:
            if xid not in APPLICATION_XIDS:
                self._xids.setdefault(index, []).append(xid)
            self._new_xids = [*self._new_xids[-(XID_LOG - 1) :], (index, xid)]
            self._xids_seen += 1
            self._xid_counts[index, xid] = self._xid_counts.get((index, xid), 0) + 1
        log.warning("XID %d on GPU %d", xid, index)

    def _scan_kernel_log(self) -> None:
        by_bus = {
            kmsg.normalize_bus_id(r.bus_id): r.index for r in self.snapshot().gpus if r.bus_id
        }
        for found in kmsg.parse(self._kernel_log()):
            if found.bus_id in by_bus and found.xid not in APPLICATION_XIDS:
                with self._lock:
                    self._xids.setdefault(by_bus[found.bus_id], []).append(found.xid)
        self.sample()

    def _sample_loop(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self.sample()
            except Exception:  # the sampler must survive anything a driver does
                log.exception("GPU sampling failed")

    def _xid_loop(self) -> None:
        assert self._backend is not None
        while not self._stopped.is_set():
            try:
                events = self._backend.wait_xids(XID_WAIT_S)
            except Exception:
                log.exception("XID wait failed")
                self._stopped.wait(1.0)
                continue
            for index, xid in events:
                self._record_xid(index, xid)
            if events:
                self.sample()
