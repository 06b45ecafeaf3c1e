"""Key groups: a stateful function's keys map to a fixed number of contiguous hash ranges.

A key's group never changes (numKeyGroups is immutable), so state moves between instances a
whole group at a time and a group is the unit of ownership, migration and changelog restore
(DRRS and Flink call it a key group). Groups are contiguous ranges of Pulsar's Key_Shared hash
space (0..65535), so a set of groups is a set of Key_Shared sticky hash ranges.

Everything here is pure: no I/O, no clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import mmh3

KEY_HASH_RANGE = 65536
DEFAULT_NUM_KEY_GROUPS = 128
MAX_NUM_KEY_GROUPS = KEY_HASH_RANGE


def key_hash(key: str | bytes) -> int:
    """The key's slot in Pulsar's Key_Shared hash space: Murmur3_32Hash(UTF-8 bytes) % 65536.

    Pulsar's Java `org.apache.pulsar.common.util.Murmur3_32Hash.makeHash(byte[])` is MurmurHash3
    x86_32 with seed 0, sign bit cleared; Key_Shared takes it modulo the range size 65536. mmh3 gives
    the same values: checked against the test vectors the Pulsar C++ client asserts are "Same value as
    Java client" (k1 -> 2110152746, key01 -> 39696932, ...; tests/unit/functions/model/test_keygroups.py). Pulsar 4
    dispatchers map slot 0 to 1; both lie in group 0 unless numKeyGroups is 65536.
    """
    data = key.encode() if isinstance(key, str) else bytes(key)
    return (mmh3.hash(data, 0, signed=True) & 0x7FFFFFFF) % KEY_HASH_RANGE


def _check_groups(num_key_groups: int) -> None:
    if not 1 <= num_key_groups <= MAX_NUM_KEY_GROUPS:
        raise ValueError(f"numKeyGroups must be from 1 to {MAX_NUM_KEY_GROUPS}, got {num_key_groups}")


def key_group(key: str | bytes, num_key_groups: int) -> int:
    """The group of a key: its hash slot scaled to the group count (contiguous ranges, not modulo)."""
    return key_hash(key) * num_key_groups // KEY_HASH_RANGE


def hash_range(group: int, num_key_groups: int) -> tuple[int, int]:
    """The Key_Shared hash range (start, end inclusive) whose slots key_group maps to `group`."""
    _check_groups(num_key_groups)
    if not 0 <= group < num_key_groups:
        raise ValueError(f"group {group} is outside 0..{num_key_groups - 1}")
    # slot s is in group g iff g*R <= s*G < (g+1)*R, i.e. s in [ceil(g*R/G), ceil((g+1)*R/G) - 1].
    start = -(-group * KEY_HASH_RANGE // num_key_groups)
    end = -(-(group + 1) * KEY_HASH_RANGE // num_key_groups) - 1
    return start, end


@dataclass(frozen=True)
class Move:
    group: int
    src: int
    dst: int


@dataclass(frozen=True)
class KeyGroupAssignment:
    """Which instance owns each key group: owners[g] is the instance id (0..parallelism-1) of group g."""

    num_key_groups: int
    owners: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_groups(self.num_key_groups)
        if len(self.owners) != self.num_key_groups:
            raise ValueError(f"{len(self.owners)} owners for {self.num_key_groups} key groups")
        if any(o < 0 for o in self.owners):
            raise ValueError("an owner instance id is negative")

    @classmethod
    def uniform(cls, num_key_groups: int, parallelism: int) -> "KeyGroupAssignment":
        """Contiguous blocks: instance i owns groups [ceil(i*G/P), ceil((i+1)*G/P)), balanced within 1."""
        _check_groups(num_key_groups)
        if parallelism < 1:
            raise ValueError(f"parallelism must be at least 1, got {parallelism}")
        return cls(num_key_groups, tuple(g * parallelism // num_key_groups for g in range(num_key_groups)))

    @property
    def parallelism(self) -> int:
        return max(self.owners) + 1

    def groups_of(self, instance_id: int) -> tuple[int, ...]:
        return tuple(g for g, o in enumerate(self.owners) if o == instance_id)

    def owner(self, key: str | bytes) -> int:
        return self.owners[key_group(key, self.num_key_groups)]

    def rescale(self, new_parallelism: int) -> "KeyGroupAssignment":
        """The assignment for instances 0..new_parallelism-1 that moves the fewest groups.

        Instances at or above new_parallelism (scaled in) give up all their groups. Every surviving
        instance gets a target of floor(G/P) or floor(G/P)+1 groups; the +1 targets go to the instances
        that hold the most groups now (ties: lower id), so sum(min(held, target)) -- the groups that stay --
        is the largest possible. An instance over its target keeps its lowest-numbered groups; freed
        groups go in order to the instances under target, lowest id first. Deterministic.
        """
        if new_parallelism < 1:
            raise ValueError(f"parallelism must be at least 1, got {new_parallelism}")
        g_count = self.num_key_groups
        held = [list(self.groups_of(i)) for i in range(new_parallelism)]
        base, extra = divmod(g_count, new_parallelism)
        by_size = sorted(range(new_parallelism), key=lambda i: (-len(held[i]), i))
        target = [base] * new_parallelism
        for i in by_size[:extra]:
            target[i] += 1
        owners = list(self.owners)
        freed = [g for g, o in enumerate(self.owners) if o >= new_parallelism]
        for i in range(new_parallelism):
            freed.extend(held[i][target[i] :])
        freed.sort()
        it = iter(freed)
        for i in range(new_parallelism):
            for _ in range(target[i] - min(len(held[i]), target[i])):
                owners[next(it)] = i
        return KeyGroupAssignment(g_count, tuple(owners))


def moves(old: KeyGroupAssignment, new: KeyGroupAssignment) -> list[Move]:
    """The groups whose owner differs, in group order."""
    if old.num_key_groups != new.num_key_groups:
        raise ValueError(f"numKeyGroups differ: {old.num_key_groups} vs {new.num_key_groups} (it is immutable)")
    return [Move(g, a, b) for g, (a, b) in enumerate(zip(old.owners, new.owners)) if a != b]


def subscales(planned: list[Move], size: int) -> list[list[Move]]:
    """DRRS subscale division: batches of at most `size` groups that migrate independently, in order."""
    if size < 1:
        raise ValueError(f"subscale size must be at least 1, got {size}")
    return [planned[i : i + size] for i in range(0, len(planned), size)]
