"""A state value one changelog record cannot carry is refused before the store changes, so the store and its
changelog never disagree (a value kept only in the store would be lost by the next failover or migration)."""

from __future__ import annotations

import pytest

from pulsar_autoscale.functions.state.changelog import MAX_VALUE_BYTES, StateValueTooLarge
from pulsar_autoscale.functions.state.store import StateStore


def test_a_value_over_one_message_is_refused_and_the_old_value_stays(tmp_path):
    store = StateStore(tmp_path / "state.sqlite", 128, keyed=False)
    store.put_state("k", b"old")
    with pytest.raises(StateValueTooLarge, match="nothing was stored"):
        store.put_state("k", b"x" * (MAX_VALUE_BYTES + 1))
    assert bytes(store.get_state("k")) == b"old"
    store.put_state("k", "y" * MAX_VALUE_BYTES)
    assert len(store.get_state("k")) == MAX_VALUE_BYTES
