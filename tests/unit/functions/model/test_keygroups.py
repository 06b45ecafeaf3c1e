"""Key groups: Pulsar's key hash, contiguous ranges, and rescale moving only what must move."""

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsar_autoscale.functions.model.keygroups import (
    KEY_HASH_RANGE,
    KeyGroupAssignment,
    hash_range,
    key_group,
    key_hash,
    moves,
    subscales,
)

# The Pulsar C++ client's HashTest.testMurmur3_32Hash: "Same value as Java client" (Murmur3_32Hash.makeHash).
PULSAR_VECTORS = {
    "k1": 2110152746,
    "k2": 1479966664,
    "key1": 462881061,
    "key2": 1936800180,
    "key01": 39696932,
    "key02": 751761803,
}


@pytest.mark.parametrize("key,java_hash", sorted(PULSAR_VECTORS.items()))
def test_key_hash_is_pulsars_murmur3_32(key, java_hash):
    assert key_hash(key) == java_hash % KEY_HASH_RANGE
    assert key_hash(key.encode()) == key_hash(key)


@given(st.integers(1, 4096), st.data())
def test_hash_ranges_tile_the_hash_space_and_match_key_group(g_count, data):
    ranges = [hash_range(g, g_count) for g in range(g_count)] if g_count <= 256 else None
    if ranges:
        assert ranges[0][0] == 0 and ranges[-1][1] == KEY_HASH_RANGE - 1
        assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))
    key = data.draw(st.binary(max_size=40))
    g = key_group(key, g_count)
    start, end = hash_range(g, g_count)
    assert start <= key_hash(key) <= end


def _optimal_kept(old: KeyGroupAssignment, p: int) -> int:
    """Brute force over every choice of which survivors get the +1 target."""
    held = [len(old.groups_of(i)) for i in range(p)]
    base, extra = divmod(old.num_key_groups, p)
    return max(sum(min(h, base + (i in plus)) for i, h in enumerate(held)) for plus in combinations(range(p), extra))


owners_st = st.integers(1, 200).flatmap(
    lambda g: st.integers(1, 9).flatmap(lambda p: st.lists(st.integers(0, p - 1), min_size=g, max_size=g))
)


@settings(max_examples=300, deadline=None)
@given(owners_st, st.integers(1, 9))
def test_rescale_is_balanced_sticky_and_moves_the_minimum(owners, new_p):
    old = KeyGroupAssignment(len(owners), tuple(owners))
    new = old.rescale(new_p)
    counts = [len(new.groups_of(i)) for i in range(new_p)]
    assert sum(counts) == old.num_key_groups and max(counts) - min(counts) <= 1  # balanced within 1
    assert all(o < new_p for o in new.owners)
    planned = moves(old, new)
    assert len(planned) == old.num_key_groups - _optimal_kept(old, new_p)  # minimal for balanced
    for m in planned:  # sticky: a group leaves only
        assert m.src >= new_p or len(old.groups_of(m.src)) > counts[m.src]  # an instance over its target
    assert new == old.rescale(new_p)  # deterministic
    assert new.rescale(new_p) == new  # a balanced one stays put


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 256), st.lists(st.integers(1, 12), min_size=1, max_size=10))
def test_a_sequence_of_rescales_from_uniform_stays_balanced(g_count, parallelisms):
    a = KeyGroupAssignment.uniform(g_count, parallelisms[0])
    for p in parallelisms[1:]:
        b = a.rescale(p)
        counts = [len(b.groups_of(i)) for i in range(p)]
        assert max(counts) - min(counts) <= 1
        a = b


def test_uniform_is_contiguous_and_scale_out_moves_a_third():
    a = KeyGroupAssignment.uniform(128, 2)
    assert a.groups_of(0) == tuple(range(64)) and a.groups_of(1) == tuple(range(64, 128))
    planned = moves(a, a.rescale(3))
    assert len(planned) == 42 and {m.dst for m in planned} == {2}
    batches = subscales(planned, 4)
    assert [len(b) for b in batches] == [4] * 10 + [2] and sum(batches, []) == planned


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="numKeyGroups"):
        KeyGroupAssignment.uniform(0, 1)
    with pytest.raises(ValueError, match="parallelism"):
        KeyGroupAssignment.uniform(8, 2).rescale(0)
    with pytest.raises(ValueError, match="subscale"):
        subscales([], 0)
    with pytest.raises(ValueError, match="immutable"):
        moves(KeyGroupAssignment.uniform(8, 2), KeyGroupAssignment.uniform(16, 2))
