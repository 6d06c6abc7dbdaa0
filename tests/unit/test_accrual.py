"""The phi accrual detector (job/accrual.py) as a table: what silence suspects a peer, at the
intervals its beats came at."""

from __future__ import annotations

import random

import pytest

from nodeagent.job.accrual import FLOOR_BEATS, MIN_SAMPLES, WINDOW, Arrivals, Silence

RULE = Silence(interval=0.1, timeout=2.0, phi=8.0)


def arrivals(*intervals: float) -> Arrivals:
    made = Arrivals()
    for interval in intervals:
        made.add(interval)
    return made


STEADY = arrivals(*[0.1] * 100)
rng = random.Random(7)
JITTERY = arrivals(*[max(0.0, rng.gauss(0.1, 0.15)) for _ in range(WINDOW)])  # a loaded machine


@pytest.mark.parametrize(
    ("rule", "history", "silence", "suspect"),
    [
        (RULE, STEADY, 0.49, False),  # below the floor, however steady the beats
        (RULE, STEADY, 0.50, True),  # FLOOR_BEATS intervals: suspected, 4 times under timeout
        (RULE, JITTERY, 0.50, False),  # beats that spread: the same silence is likely enough
        (RULE, JITTERY, 1.50, True),  # but not this one
        (RULE, arrivals(*[0.1] * (MIN_SAMPLES - 1)), 1.9, False),  # too few: the timeout judges
        (RULE, arrivals(*[0.1] * (MIN_SAMPLES - 1)), 2.01, True),
        (RULE, JITTERY, 2.01, True),  # the timeout, whatever the history
        (Silence(0.1, 2.0, phi=0.0), STEADY, 1.9, False),  # phi off: the timeout alone
        (Silence(0.1, 0.3, phi=8.0), STEADY, 0.31, True),  # a timeout under the floor wins
    ],
)
def test_a_silence_is_suspected_when_unlikely_at_its_peers_intervals(
    rule: Silence, history: Arrivals, silence: float, suspect: bool
) -> None:
    assert rule.suspect(silence, history) is suspect


def test_the_silence_tolerated_grows_with_the_spread_of_the_intervals() -> None:
    steady, jittery = RULE.within(STEADY), RULE.within(JITTERY)
    assert steady == pytest.approx(FLOOR_BEATS * 0.1, abs=1e-3)
    assert steady < jittery < RULE.timeout
    mean, spread = JITTERY.mean_and_spread()
    assert jittery > mean + 4 * spread  # phi 8: several deviations past the mean


def test_the_window_keeps_the_last_intervals_and_their_sums() -> None:
    history = arrivals(*[5.0] * WINDOW, *[0.1] * WINDOW)  # an old pause, forgotten
    mean, spread = history.mean_and_spread()
    assert len(history.intervals) == WINDOW
    assert mean == pytest.approx(0.1) and spread == pytest.approx(0.0, abs=1e-6)
    assert RULE.phi_of(0.1, history) < 1 < RULE.phi_of(0.3, history)
