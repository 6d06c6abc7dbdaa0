"""Which CPUs are near a GPU, pure: NVML's CPU affinity mask (`nvmlDeviceGetCpuAffinity`, an
array of 64-bit words, bit N of word W is CPU 64W+N) and the Linux CPU list syntax a fake GPU
file and the kernel write ("0-15,32-47"), both ways (docs/isolation.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

WORD_BITS = 64


def mask_words(cpus: int) -> int:
    """How many words a mask of `cpus` CPUs takes (what nvmlDeviceGetCpuAffinity is asked)."""
    return max(1, -(-cpus // WORD_BITS))


def cpus_of_mask(words: Sequence[int]) -> tuple[int, ...]:
    """The CPUs a mask names, ascending."""
    return tuple(
        index * WORD_BITS + bit
        for index, word in enumerate(words)
        for bit in range(WORD_BITS)
        if int(word) >> bit & 1
    )


def mask_of_cpus(cpus: Iterable[int], words: int) -> list[int]:
    """The mask of `cpus` in `words` words (CPUs beyond them are left out, as NVML does)."""
    mask = [0] * words
    for cpu in cpus:
        if 0 <= cpu < words * WORD_BITS:
            mask[cpu // WORD_BITS] |= 1 << cpu % WORD_BITS
    return mask


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11).

    Raises:
        ValueError: not a CPU list.
    """
    found: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, dash, last = part.partition("-")
        low, high = int(first), int(last) if dash else int(first)
        if low < 0 or high < low:
            raise ValueError(f"{part!r} is not a CPU range (LOW-HIGH, LOW <= HIGH)")
        found.update(range(low, high + 1))
    return tuple(sorted(found))


def cpu_list(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 3, 8) -> '0-3,8': the kernel's own way of writing a set of CPUs."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    start = previous = None
    for cpu in [*ordered, None]:
        if cpu is not None and previous is not None and cpu == previous + 1:
            previous = cpu
            continue
        if start is not None and previous is not None:
            runs.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = cpu
    return ",".join(runs)
