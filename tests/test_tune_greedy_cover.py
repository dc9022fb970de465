"""experiments.tune_space.greedy_cover (the tune search's pair cover) picks what a full rescan picks: the set adding
the most uncovered elements, the first among equals, until the goal is covered or nothing adds. CPU only."""
from __future__ import annotations

import random

import pytest

from experiments.tune_space import greedy_cover


def _rescan(sets, covered, goal):
    covered, rest, picked = set(covered), list(range(len(sets))), []
    while rest and not goal <= covered:
        gains = [len(sets[i] - covered) for i in rest]
        j = max(range(len(rest)), key=lambda k: gains[k])
        if gains[j] == 0:
            break
        picked.append(rest.pop(j))
        covered |= sets[picked[-1]]
    return picked


@pytest.mark.parametrize("seed", range(20))
def test_same_picks_as_a_full_rescan(seed):
    rng = random.Random(seed)
    universe = range(rng.randint(5, 60))
    sets = [set(rng.sample(universe, rng.randint(0, min(12, len(universe))))) for _ in range(rng.randint(1, 80))]
    sets += [set(s) for s in rng.sample(sets, len(sets) // 3)]  # duplicates: ties broken by position
    covered = set(rng.sample(universe, rng.randint(0, len(universe) // 4)))
    goal = set().union(*sets) | covered if seed % 2 else set(rng.sample(universe, len(universe) // 2))
    picked = greedy_cover(sets, covered, goal)
    assert picked == _rescan(sets, covered, goal)
    assert len(picked) == len(set(picked))


def test_stops_when_covered_or_nothing_adds():
    assert greedy_cover([{1}, {1, 2}, {3}], set(), {1, 2}) == [1]
    assert greedy_cover([{1}, {2}], {1, 2}, {1, 2}) == []
    assert greedy_cover([{1}, {1}], {1}, {1, 5}) == []  # 5 is in no set: stop when no set adds
    covered = {9}
    greedy_cover([{1}], covered, {1})
    assert covered == {9}  # the caller's set is left alone
