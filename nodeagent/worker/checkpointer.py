"""Checkpoints of sharded models that survive a worker crash: `Checkpointer` and `TrainState`.

    state = TrainState(model, optimizer, epoch=0, offset=0)   # FSDP2, TP, 2-D, DDP: any model
    checkpoints = Checkpointer("/shared/ckpt/run-1")            # the script's own directory
    start = checkpoints.restore(state)                          # once; the step to go on from
    for step in range(start + 1, total + 1):
        train_one_step()
        if step % 10 == 0:
            checkpoints.save(state, step)                       # returns once staged
    checkpoints.close()                                          # waits for the last write

Under nodeagent with a `checkpoint:` section, `save` writes into the node's memory tier, a
tmpfs directory the agent owns (it outlives the worker); the agent copies it to the persistent
tier, and before a generation starts the leader chooses one source for every rank, which
`restore` tries in order (nodeagent.channel.restore's RESTORE_ENV), agreeing with the other ranks
at each one. Under plain torchrun (or a job without the section) the same calls save and load
DCP checkpoints in `directory` (`step-<S>/rank-<R>/`). Every file is verified against its
manifest before it is loaded, and a loaded state with a NaN or an infinity is refused too.

`save` copies the state to host memory (staging: the training step is blocked only that long)
and writes it from a thread, with no collective (nodeagent.worker.dcpio), so the write never
interleaves with the training's own collectives. A save still being written when the next one
starts is waited for first.

With copies to peers (`replicas`), a save never goes over the committed one, which the agent
pins (nodeagent.channel.pin): while the copies of the newer save in the other slot are under
way, `save` stages the state but skips the write and returns False, for a few save intervals
at most; `close` writes the last one skipped, so the step a stopping worker reached is kept.
Every rank skips the same saves (one all_reduce of a flag per save, with `replicas` only): a
step some ranks saved and others not could never be restored anyway.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.channel import fetching, layout, manifests, pin, tier
from nodeagent.channel.manifests import BadCopy, Manifest, NoSave
from nodeagent.channel.restore import (
    NON_FINITE,
    RESTORE_ENV,
    RESTORE_REPORT_ENV,
    Refusal,
    RefusalKind,
    RestoreReport,
    Source,
    moved_report,
    order_from_env,
    write_report,
)
from nodeagent.worker import dcpio
from nodeagent.worker.agree import Problem, agree, any_rank
from nodeagent.worker.follow import Follower, Reform
from nodeagent.worker.trainstate import Saveable

log = logging.getLogger(__name__)
# A save skipped to keep the committed one (channel/pin.py) waits for the newer save to commit
# this many save intervals, and at least this long, before it is written over it instead.
PATIENCE_SAVES = 3
PATIENCE_S = 60.0


@dataclass(frozen=True)
class Restored:
    """What `restore` loaded, and what it refused on the way."""

    source: Source
    seconds: float
    refused: tuple[tuple[Source, Problem], ...] = ()
    saves: int = 0  # how many ranks' saves it read: 1, or those it reshards from


class Checkpointer:
    """Saves and restores a `TrainState` or any `Saveable` (see the module docstring).

    Args:
        directory: the script's own checkpoints: where they go under plain torchrun, and the
            last source tried under nodeagent. None: only the agent's tiers.
        keep: how many steps a directory keeps (newest first).
        env: where nodeagent's variables are read (default os.environ).
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        keep: int = 2,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.directory = Path(directory) if directory is not None else None
        self.keep = max(1, keep)
        self.job = env.get("NODEAGENT_JOB_ID", "")
        memory, persist = env.get(tier.MEMORY_ENV), env.get(tier.PERSIST_ENV)
        self.memory = Path(memory) if memory else None
        area = env.get(tier.REPLICAS_ENV)
        self.replicas = Path(area) if area else None  # copies of peers' saves (read only)
        self.persistent = Path(persist) if persist else None
        self.limit = int(env.get(tier.MEMORY_LIMIT_ENV, "0") or 0)
        report = env.get(RESTORE_REPORT_ENV)
        self._report_path = Path(report) if report else None
        if self.memory is None and self.directory is None:
            raise ValueError("Checkpointer: give it a directory (no nodeagent memory tier here)")
        self.follower = Follower(int(env.get("NODEAGENT_GENERATION", "0")))
        self._assigned(env)
        self._stage_cache: Any = None
        self._staged: tuple[int, int] | None = None  # (generation, step) of the last save
        self._loaded: Any = None  # a source loaded by this rank, not yet agreed on
        self._saves_read = 0  # how many ranks' saves that source was read from
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_blocked_s = 0.0  # how long the last save held the training step
        self.last_saved_step: int | None = None
        self._last_call: float | None = None  # when `save` was last called (monotonic)
        self._skipping: tuple[Any, ...] | None = None  # the pin and newer save last said
        # A save skipped, staged: (state, step, blocked_s, row counts), written by `close`.
        self._pending: tuple[Any, int, float, tuple[int, ...] | None] | None = None
        self._told_to_leave = False  # check() raised Reform: the agent asked the ranks to leave

    def _assigned(self, env: Mapping[str, str]) -> None:
        """What changes with each generation: this process's rank and world, the restore order."""
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.generation = int(env.get("NODEAGENT_GENERATION", "0"))
        chosen = env.get(RESTORE_ENV)
        self.sources = order_from_env(chosen) if chosen else None

    # -- in place (nodeagent.worker.elastic.run) --------------------------------------------

    def check(self, state: Saveable, step: int) -> None:
        """Under `elastic.run(train, checkpoints)` (job.recovery: in_place), after every step, on
        every rank: when the agent has told any rank to leave the generation (a scale, a drain,
        a peer that failed), every rank saves `step` and raises Reform, so the job re-forms
        losing no step. One all_reduce of a flag; nothing at all without an agent.

        Raises:
            Reform: the job re-forms (let it reach `run`).
        """
        reform = self.reform_due()
        if reform is not None:
            if self._staged != (self.generation, step):  # not saved at this step already
                self.save(state, step)
            raise reform

    def reform_due(self) -> Reform | None:
        """Why the job re-forms, if the agent told any rank to leave the generation, agreed by
        every rank (one all_reduce; None without an agent): `check` without the save, for a
        script that saves its own way first. Once it said so, a save skipped (the newer one
        not committed yet) is written as the rank leaves, as after `check`: the leave was asked
        for, every rank saved that step."""
        if self.follower.channel is None:
            return None
        reform = self.follower.news()
        if any_rank(reform is not None) and reform is None:
            reform = Reform(f"another rank was told to leave generation {self.generation}")
        if reform is not None:
            self._told_to_leave = True
        return reform

    def sync(self) -> None:
        """In the new process group: take the assignment's rank, world and restore order (the
        script then builds its model and calls `restore`), and where to report the restore (an
        in_place survivor is told no path: the agent's layout gives it)."""
        generation = self.generation
        self._assigned(os.environ)
        if self._report_path is not None and self.generation != generation:
            self._report_path = moved_report(self._report_path, self.generation, self.rank)

    def leaving(self) -> None:
        """The process group is gone: finish the save being written (the agent verifies it once
        told this rank left), and drop the staging copy, which refers to the old group. The
        save skipped last is written (`close`) only when the agent told the ranks to leave
        (`check`); after a failure it is dropped: a rank that failed never saved that step, and
        written over the newer save it would leave neither whole."""
        if self._pending is not None and not self._told_to_leave:
            log.info(
                "rank %d: step %d, skipped, is dropped: the group failed",
                self.rank,
                self._pending[1],
            )
            self._pending = None
        self._told_to_leave = False
        try:
            self.close()
        except Exception as exc:  # it is not committed: the agent will not see it
            log.warning("rank %d: the last save failed: %s", self.rank, exc)
        self._stage_cache = None
        self._loaded = None

    # -- saving -----------------------------------------------------------------------------

    def save(self, state: Saveable, step: int) -> bool:
        """Stage `state` as step `step` and write it in the background. Returns False when the
        write is skipped: in the memory tier, the slot it would go to holds the committed save
        and the other the newer one, whose copies are still under way (channel/pin.py). The
        staged state is then written by `close` if no save follows (a stop's save is kept).

        Raises: the previous write's error, if it failed (nothing of it was committed)."""
        began = time.perf_counter()
        failed: Exception | None = None
        try:
            self.wait()
        except Exception as exc:  # raised once the ranks agreed: none waits in the all_reduce
            failed = exc
        patience = self._patience(time.monotonic())
        target = self._target(step, patience) if failed is None else None
        agreeing = self.memory is not None and self.replicas is not None
        if agreeing and any_rank(target is None):  # a rank keeps its committed save, or failed
            target = None
        if failed is not None:
            raise failed
        state_dict = state.state_dict()
        rows = dcpio.row_counts(state_dict, self.world_size)
        staged = self._stage(state_dict)
        self._pending = None  # superseded
        self._staged = (self.generation, step)
        self.last_blocked_s = time.perf_counter() - began
        if target is None:
            self._pending = (staged, step, self.last_blocked_s, rows)
            return False
        self._thread = threading.Thread(
            target=self._write,
            args=(staged, target, step, self.last_blocked_s, rows),
            name="nodeagent-save",
            daemon=False,
        )
        self._thread.start()
        return True

    def _patience(self, now: float) -> float:
        """How long a save waits (skipped) for the newer one to commit: PATIENCE_SAVES save
        intervals as this process saw them (its calls to `save`), at least PATIENCE_S."""
        last, self._last_call = self._last_call, now
        return max(PATIENCE_S, PATIENCE_SAVES * (now - last)) if last is not None else PATIENCE_S

    def wait(self) -> None:
        """Until the save being written is committed. Raises: its error, if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Until the last save is written: the one being written, or the last one skipped,
        written now over the newer save (never the committed one). Raises: its error."""
        self.wait()
        if self._pending is not None:
            staged, step, blocked_s, rows = self._pending
            self._pending = None
            target = self._target(step, patience=0.0)
            assert target is not None  # never skipped without patience
            self._write(staged, target, step, blocked_s, rows)
            self.wait()

    def _stage(self, state_dict: dict[str, Any]) -> Any:
        """A host-memory copy of `state_dict`, into the previous copy's buffers when they fit."""
        import torch
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        cuda = torch.cuda.is_available()
        try:
            if self._stage_cache is None:
                self._stage_cache = _create_cpu_state_dict(state_dict, pin_memory=cuda)
            staged = _copy_state_dict(state_dict, self._stage_cache, non_blocking=cuda)
        except (ValueError, RuntimeError, KeyError):  # the state's shape changed: stage anew
            self._stage_cache = _create_cpu_state_dict(state_dict, pin_memory=cuda)
            staged = _copy_state_dict(state_dict, self._stage_cache, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize()
        return staged

    def _target(self, step: int, patience: float) -> Path | None:
        """Where the save of `step` goes; None: it is skipped (channel/pin.py)."""
        if self.memory is None:
            assert self.directory is not None
            return tier.rank_dir(tier.step_dir(self.directory, step), self.rank)
        slots = tier.slots(self.memory, self.rank)
        try:  # without copies to peers nothing is pinned (a pin left from before is stale)
            pinned = pin.read(self.memory) if self.replicas is not None else None
        except BadCopy as exc:
            log.warning("rank %d: nothing pinned: %s", self.rank, exc)
            pinned = None
        held = pin.look(slots)
        index = pin.choose(held, pinned, self.generation, time.time(), patience)
        if index is not None:
            return slots[index]
        newer = max((h for h in held if h is not None), key=lambda h: h.key[0])
        committed = pinned.key if pinned is not None else None
        if (committed, newer.key) != self._skipping:
            self._skipping = (committed, newer.key)
            kept = f"the committed step {committed[0]}" if committed else "nothing committed yet"
            log.warning(
                "rank %d: step %d not saved (%s): step %d, the newer save, is not committed "
                "yet (saves outpace the copies: replication.max_rate, the save interval); "
                "written at close if no save follows",
                self.rank,
                step,
                kept,
                newer.key[0],
            )
        return None

    def _write(
        self, staged: Any, target: Path, step: int, blocked_s: float, rows: tuple[int, ...] | None
    ) -> None:
        try:
            manifests.begin(target)
            dcpio.save_rank(staged, target)
            manifest = Manifest(
                step=step,
                generation=self.generation,
                world_size=self.world_size,
                rank=self.rank,
                files=manifests.summarize(target),
                job=self.job,
                blocked_s=blocked_s,
                dim0=rows,
            )
            if self.limit and manifest.size > self.limit:
                manifests.begin(target)
                raise ValueError(
                    f"a save of rank {self.rank} takes {manifest.size:,} bytes, more than the "
                    f"{self.limit:,} its memory tier allows (checkpoint.memory_size / 2 slots / "
                    "nproc_per_node): raise checkpoint.memory_size"
                )
            manifests.write_manifest(target, manifest, durable=self.memory is None)
            self.last_saved_step = step
            if self.memory is None:
                self._prune()
        except BaseException as exc:  # raised by the next save or wait
            self._error = exc

    def _prune(self) -> None:
        """This rank's directories of steps older than the newest `keep` it saved."""
        assert self.directory is not None
        mine = [s for s in tier.steps(self.directory) if self._has_own(s)]
        for old in mine[self.keep :]:
            step_path = tier.step_dir(self.directory, old)
            shutil.rmtree(tier.rank_dir(step_path, self.rank), ignore_errors=True)
            with contextlib.suppress(OSError):  # not empty yet, or another rank removed it
                step_path.rmdir()

    def _has_own(self, step: int) -> bool:
        assert self.directory is not None
        own = tier.rank_dir(tier.step_dir(self.directory, step), self.rank) / manifests.MANIFEST
        return own.is_file()

    # -- restoring --------------------------------------------------------------------------

    def restore(self, state: Saveable) -> int:
        """Load the state the job resumes from into `state`; the step it holds (0: none).
        Every rank calls it at the same point (it agrees with the others at each source)."""
        began = time.perf_counter()
        refused: list[tuple[Source, Problem]] = []
        default = (Source("script"), Source("start"))
        if self.replicas is not None and any(s.tier == "memory" for s in self.sources or ()):
            waited = fetching.wait(self.replicas, self.generation)  # the agent brings saves
            if waited >= 0.1:
                log.info("rank %d: waited %.2fs for saves brought from peers", self.rank, waited)
        for source in self.sources or default:
            if source.tier == "start":
                break
            self._loaded = None
            mine, step = self._try(source, state)
            problem = agree(mine)
            if problem is None:
                assert self._loaded is not None
                state.load_state_dict(self._loaded)  # only once every rank has its copy
                self._loaded = None
                self._forget_after(step)
                seconds = time.perf_counter() - began
                done = Restored(Source(source.tier, step), seconds, saves=self._saves_read)
                self._tell(done, refused)
                return step
            refused.append((source, problem))
            log.log(
                logging.INFO if problem[0] == RefusalKind.ABSENT else logging.WARNING,
                "rank %d: not restoring from %s: %s",
                self.rank,
                source,
                problem[1],
            )
        self._forget_after(0)
        self._tell(Restored(Source("start"), time.perf_counter() - began), refused)
        return 0

    def _forget_after(self, step: int) -> None:
        """Drop this rank's memory-tier saves of steps after `step`: the job goes on from
        `step`, so they belong to a timeline it abandoned and must never be restored."""
        if self.memory is None:
            return
        for slot in tier.slots(self.memory, self.rank):
            manifest = manifests.manifest_in(slot)
            if manifest is not None and manifest.step > step:
                manifests.begin(slot)

    def _try(self, source: Source, state: Saveable) -> tuple[Problem | None, int]:
        """Load `source` into `state`; (None, step) or (why not, -1)."""
        try:
            if source.tier == "memory":
                if self.memory is None or source.step is None:
                    return (RefusalKind.ABSENT, "no memory tier on this node"), -1
                slots = self._memory_slots(source.step, source.generation)
                return self._load(state, slots, source.step, source.generation), source.step
            root = self.persistent if source.tier == "persistent" else self.directory
            if root is None:
                return (RefusalKind.ABSENT, f"no {source.tier} directory given"), -1
            step = source.step if source.step is not None else self._newest_whole(root)
            if step is None:
                return (RefusalKind.ABSENT, f"no step in {root} that every rank can read"), -1
            generation = source.generation if source.step is not None else None
            return self._load(state, self._rank_dirs(root, step), step, generation), step
        except NoSave as exc:  # a rank's save missing: nothing wrong with any copy
            return (RefusalKind.ABSENT, str(exc)), -1
        except (BadCopy, dcpio.Unsafe, OSError) as exc:  # forged, damaged or unreadable
            return (RefusalKind.BAD_COPY, f"{type(exc).__name__}: {exc}"), -1
        except (ValueError, RuntimeError, KeyError) as exc:  # DCP: not this model's state
            return (RefusalKind.ABSENT, f"{type(exc).__name__}: {exc}"), -1
        except Exception as exc:  # whatever else reading a source raised: the next one is tried
            return (RefusalKind.BAD_COPY, f"{type(exc).__name__}: {exc}"), -1

    def _memory_slots(self, step: int, generation: int | None) -> list[Path]:
        """The slots this rank reads step `step` from, on this node (its memory tier, then the
        copies of peers' saves the agent keeps or brought): its own rank's save at the world it
        was saved at, else the old ranks it reads (resharding). Raises: NoSave naming what is
        missing."""
        find = functools.partial(tier.find_save, self.memory, self.replicas)
        own = find(self.rank, step, generation)
        first = own or tier.any_save(self.memory, self.replicas, step, generation)
        if first is None:
            raise NoSave(f"rank {self.rank} holds no step {step} on this node")
        manifest = manifests.read_manifest(first)
        if manifest.world_size == self.world_size:
            if own is None:
                raise NoSave(f"rank {self.rank} holds no step {step} on this node")
            return [own]
        ranks = layout.reads(manifest.world_size, manifest.dim0, [self.rank], self.world_size)
        slots = [find(r, step, generation) for r in ranks]
        missing = [r for r, slot in zip(ranks, slots, strict=True) if slot is None]
        if missing:
            raise NoSave(
                f"step {step} saved at world {manifest.world_size}: this node lacks ranks "
                f"{missing} of the {ranks} rank {self.rank} reads"
            )
        return [slot for slot in slots if slot is not None]

    def _rank_dirs(self, root: Path, step: int) -> list[Path]:
        """The directories this rank reads step `step` from: its own at the world it was saved
        at, else the old ranks it reads (resharding)."""
        saved = tier.step_dir(root, step)
        manifest = manifests.read_manifest(tier.rank_dir(saved, 0))
        ranks = layout.reads(manifest.world_size, manifest.dim0, [self.rank], self.world_size)
        return [tier.rank_dir(saved, r) for r in ranks]  # dcpio.load checks they cover it

    def _newest_whole(self, root: Path) -> int | None:
        """The newest step of `root` that every rank of this job can read (agreed)."""
        for step in tier.steps(root)[: self.keep + 2]:
            problem: Problem | None = None
            try:
                for directory in self._rank_dirs(root, step):
                    manifests.read_manifest(directory)
            except BadCopy as exc:
                problem = (RefusalKind.BAD_COPY, str(exc))
            if agree(problem) is None:
                return step
        return None

    def _load(
        self, state: Saveable, directories: list[Path], step: int, generation: int | None = None
    ) -> Problem | None:
        """Verify and load (every directory a save of `step`, by `generation` if given); the
        problem, or None.

        Raises:
            BadCopy: a file does not match its manifest."""
        for directory in directories:
            manifest = manifests.verify(directory)
            if manifest.step != step:
                return RefusalKind.ABSENT, f"{directory} holds step {manifest.step}, not {step}"
            if generation is not None and manifest.generation != generation:
                return (
                    RefusalKind.ABSENT,
                    f"{directory} holds step {step} saved by generation {manifest.generation}, "
                    f"not {generation} (another timeline)",
                )
        from torch.distributed._state_dict_utils import _create_cpu_state_dict

        # Into a copy: a source refused after loading (a NaN, another rank's failure) must not
        # leave half of it in the model.
        target = _create_cpu_state_dict(state.state_dict())
        dcpio.load(target, directories)
        bad = dcpio.first_non_finite(target)
        if bad is not None:
            return RefusalKind.BAD_STATE, f"step {step} holds a {NON_FINITE} in {bad}"
        self._loaded = target  # applied by restore() once every rank has agreed
        self._saves_read = len(directories)
        return None

    def _tell(self, done: Restored, refused: list[tuple[Source, Problem]]) -> None:
        """Say what was restored: the log, and the agent (its restore report file)."""
        log.info("rank %d restored from %s in %.2fs", self.rank, done.source, done.seconds)
        if self._report_path is None:
            return
        report = RestoreReport(
            rank=self.rank,
            tier=done.source.tier,
            step=done.source.step,
            seconds=done.seconds,
            refused=tuple(Refusal(str(s), kind, why) for s, (kind, why) in refused),
            saves=done.saves,
        )
        write_report(self._report_path, report)
