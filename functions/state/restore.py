"""What a restore applies to key groups' files: the changelog after each group's position, read one pass per shard
with the shards side by side, merged to the newest version of each key and the message ids applied whole."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator, cast

import pulsar

from pulsar_autoscale.functions.state.changelog import COUNTER, Changelog, ReadStats, Record, read_changelog


@dataclass
class RestoreStats:
    """The last open(restore=True): what was replayed and how fast (bench/state_replay.py)."""

    groups: int = 0
    from_snapshot: int = 0  # groups reopened from their released file (only the changelog after it replayed)
    snapshot_rows: int = 0
    records: int = 0
    bytes: int = 0
    duplicates: int = 0  # records a pulsar-lite reader delivered again (skipped)
    seconds: float = 0.0

    @property
    def groups_per_s(self) -> float:
        return self.groups / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds else 0.0


@dataclass
class Tail:
    """The changelog after the groups' positions: each group's rows (kind, key, ival, bval, ver, dead), the
    message ids whose records all arrived, and the position each group's file covers once they are applied."""

    rows: dict[int, list[tuple]]
    applied: dict[int, list[str]]
    ends: dict[int, bytes | None]


def read_tail(
    client: pulsar.Client,
    changelog: Changelog,
    positions: dict[int, bytes | None],
    stats: RestoreStats,
    pace: Callable[..., None] | None = None,
) -> Tail:
    """One pass over each changelog shard that holds some of the groups, from the oldest position a group of the
    shard needs (None: from the start); a group's records at or before its own position are skipped (its file has
    them). `pace`: a paced read (changelog.read_changelog)."""
    starts = {g: pulsar.MessageId.deserialize(p) if p else None for g, p in positions.items()}
    rows: dict[tuple[str, str, int], tuple] = {}  # (kind, key, kg) -> (ival, bval, ver, dead)
    applied: dict[int, list[str]] = {}
    ends: dict[int, bytes | None] = {}
    partial: dict[tuple[int, str], dict[int, Record]] = {}
    reads: dict[int, tuple[set[int], ReadStats]] = {}  # shard -> (its groups, its read)
    for g in positions:
        reads.setdefault(changelog.shard(g), (set(), ReadStats()))[0].add(g)
    shard_reads = []
    for shard, (in_shard, read) in sorted(reads.items()):
        # past the check, every group of the shard has a position, so a start to order by
        oldest = (
            None
            if any(positions[g] is None for g in in_shard)
            else positions[min(in_shard, key=lambda g: cast(pulsar.MessageId, starts[g]))]
        )
        shard_reads.append(read_changelog(client, changelog.shard_topic(shard), oldest, read, in_shard, pace, len(reads)))
    for mid, r in _round_robin(shard_reads):
        start = starts[r.group]
        if start is not None and not start < mid:
            continue  # before the group's own position: its file has it
        if r.msg_id is None:
            _apply(rows, r)
            continue
        parts = partial.setdefault((r.group, r.msg_id), {})
        parts[r.part] = r  # by index: a record read twice is one part
        if len(parts) == r.parts:  # every record of the message arrived: apply them together
            del partial[(r.group, r.msg_id)]
            for p in parts.values():
                _apply(rows, p)
            applied.setdefault(r.group, []).append(r.msg_id)
    for in_shard, read in reads.values():
        stats.records += read.records
        stats.bytes += read.bytes
        stats.duplicates += read.duplicates
        ends.update(dict.fromkeys(in_shard, read.end))
    by_group: dict[int, list[tuple]] = {}
    for (kind, key, g), v in rows.items():
        by_group.setdefault(g, []).append((kind, key) + v)
    return Tail(by_group, applied, ends)


def _round_robin(iterators: list[Iterator]) -> Iterator:
    """One item of each in turn: the shards of a restore are read side by side, so a paced read's lag (the
    Pacer's catch-up rule) is that of all of them against their combined write rate, not of one at a time."""
    active = deque(iterators)
    while active:
        it = active.popleft()
        try:
            item = next(it)
        except StopIteration:
            continue
        active.append(it)
        yield item


def _apply(rows: dict, r: Record) -> None:
    """Keep the highest version of each key (a tombstone too)."""
    k = (r.kind, r.key, r.group)
    old = rows.get(k)
    if old is not None and old[2] >= r.version:
        return
    if r.deleted:
        rows[k] = (None, None, r.version, 1)
    elif r.kind == COUNTER:
        rows[k] = (r.value, None, r.version, 0)
    else:
        rows[k] = (None, r.value, r.version, 0)
