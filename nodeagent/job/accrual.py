"""When a peer's silence is long enough to suspect it: the phi accrual failure detector.

A fixed timeout must be set for the worst beat the members will ever see late, so it finds a
frozen node late too. The accrual detector (Hayashibara et al., "The phi accrual failure
detector", 2004; Cassandra's `phi_convict_threshold`, Akka's cluster failure detector) learns
each peer's beat intervals instead and says how unlikely the silence so far is, as
phi = -log10(P(a beat comes later than this)), the intervals taken as normally distributed (the
logistic approximation Akka uses). A peer is suspected when phi reaches `timing.peer_phi` (8: one
chance in 10^8 that a beat is merely that late, at the intervals seen so far). On a quiet
machine, beats every 100 ms, that is the floor below; on a loaded one, where the intervals
spread, the silence tolerated grows with them, by itself.

Bounds around it:
- the floor: never below FLOOR_BEATS beats' silence (500 ms at 100 ms), whatever the history:
  a handful of intervals all alike would otherwise make a 200 ms pause unlikely enough;
- the spread is taken as at least a quarter of the interval (MIN_SPREAD), for the same reason;
- `timing.peer_timeout` (2 s): a silence that long is suspected whatever the history, as before;
- before MIN_SAMPLES intervals were heard, the timeout alone judges.

The history is each peer's last WINDOW intervals, kept with running sums: judging costs the
same at any window, at every pass of the watch, for every peer watched.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

WINDOW = 200  # intervals kept per peer: 20 s of beats at 100 ms
MIN_SAMPLES = 10  # intervals heard before the history judges
FLOOR_BEATS = 5  # the least silence suspected, in beat intervals
MIN_SPREAD = 0.25  # the least standard deviation, as a fraction of the interval


@dataclass
class Arrivals:
    """One peer's beat intervals: the last WINDOW, with their sum and sum of squares."""

    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    total: float = 0.0
    squares: float = 0.0

    def add(self, interval: float) -> None:
        if len(self.intervals) == self.intervals.maxlen:
            old = self.intervals[0]
            self.total -= old
            self.squares -= old * old
        self.intervals.append(interval)
        self.total += interval
        self.squares += interval * interval

    def mean_and_spread(self) -> tuple[float, float]:
        count = len(self.intervals)
        mean = self.total / count
        return mean, math.sqrt(max(0.0, self.squares / count - mean * mean))


@dataclass(frozen=True)
class Silence:
    """The rule a silence is judged by: the beat interval, the longest silence tolerated
    (`timing.peer_timeout`) and the accrual threshold (`timing.peer_phi`; 0: the timeout
    alone)."""

    interval: float
    timeout: float
    phi: float = 0.0

    @property
    def floor(self) -> float:
        return min(self.timeout, FLOOR_BEATS * self.interval)

    def suspect(self, silence: float, arrivals: Arrivals) -> bool:
        if silence > self.timeout:
            return True
        if self.phi <= 0 or silence < self.floor or len(arrivals.intervals) < MIN_SAMPLES:
            return False
        return self.phi_of(silence, arrivals) >= self.phi

    def phi_of(self, silence: float, arrivals: Arrivals) -> float:
        """-log10 of the chance that the next beat comes after `silence`, at these intervals."""
        mean, spread = arrivals.mean_and_spread()
        spread = max(spread, MIN_SPREAD * self.interval)
        y = (silence - mean) / spread
        e = math.exp(-y * (1.5976 + 0.070566 * y * y))
        later = e / (1.0 + e) if silence > mean else 1.0 - 1.0 / (1.0 + e)
        return -math.log10(max(later, 1e-300))

    def within(self, arrivals: Arrivals) -> float:
        """The silence after which a peer with these intervals is suspected (the logs, the
        tests), found by bisection to within a microsecond."""
        low, high = 0.0, self.timeout
        for _ in range(40):
            middle = (low + high) / 2
            low, high = (low, middle) if self.suspect(middle, arrivals) else (middle, high)
        return high
