"""How a keyedState function's key groups move: customRuntimeOptions' `keyedMigration` settings."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.model.coerce import as_int, as_number, as_object
from pulsar_autoscale.functions.model.keygroups import MAX_NUM_KEY_GROUPS

if TYPE_CHECKING:
    from pulsar_autoscale.functions.model.config import FunctionConfig


@dataclass(frozen=True)
class KeyedMigration:
    """How a keyedState function's key groups move on a parallelism change: subscales of `subscale_size` groups,
    migration work at most `duty` of the time, the pre-copy reading the changelog at most `pre_copy_mb_per_s`
    (None: as fast as `duty` lets it); `stop_the_world` pauses every group and moves all at once (what
    bench/state_migration.py compares with, and shorter in total when a pause is acceptable)."""

    subscale_size: int = 4
    duty: float = 0.5
    stop_the_world: bool = False
    pre_copy_mb_per_s: float | None = 8.0  # bench/state_migration.py --workers 3: unaffected keys' p99 unmoved


KEYED_MIGRATION_FIELDS = {"subscaleSize", "duty", "mode", "preCopyMBps"}


def keyed_migration(cfg: FunctionConfig) -> KeyedMigration:
    """customRuntimeOptions' `keyedMigration` object (Pulsar's free-form JSON field; docs/keyed-state.md)."""
    where = "customRuntimeOptions.keyedMigration"
    try:
        options = json.loads(cfg.customRuntimeOptions) if cfg.customRuntimeOptions else {}
    except json.JSONDecodeError:
        return KeyedMigration()  # not ours to judge: controls.py names a non-JSON string for its `autoscale` key
    raw = options.get("keyedMigration") if isinstance(options, dict) else None
    if raw is None:
        return KeyedMigration()
    if not cfg.keyedState:
        raise ConfigError(f"{where} is set but keyedState is false: only keyedState functions migrate key groups")
    raw = as_object(where, raw)
    unknown = set(raw) - KEYED_MIGRATION_FIELDS
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]} is unknown: use {', '.join(sorted(KEYED_MIGRATION_FIELDS))}")
    default = KeyedMigration()
    mode = raw.get("mode", "live")
    if mode not in ("live", "stop-the-world"):
        raise ConfigError(f"{where}.mode must be 'live' or 'stop-the-world', got {mode!r}")
    duty = as_number(f"{where}.duty", raw.get("duty", default.duty))
    if duty is None or not 0 < duty <= 1:
        raise ConfigError(
            f"{where}.duty must be in (0, 1] (the share of time migration work may take), got {'null' if duty is None else duty}"
        )
    size = as_int(f"{where}.subscaleSize", raw.get("subscaleSize", default.subscale_size), 1, MAX_NUM_KEY_GROUPS)
    if size is None:
        raise ConfigError(f"{where}.subscaleSize must be an integer from 1 to {MAX_NUM_KEY_GROUPS}, got null")
    rate = raw.get("preCopyMBps", default.pre_copy_mb_per_s)
    if rate is not None:
        rate = cast(float, as_number(f"{where}.preCopyMBps", rate))  # as_number gives None only for None
        if rate <= 0:
            raise ConfigError(
                f"{where}.preCopyMBps must be above 0 (MB/s the pre-copy may read), or null for no limit; got {rate}"
            )
    return KeyedMigration(size, duty, mode == "stop-the-world", rate)
