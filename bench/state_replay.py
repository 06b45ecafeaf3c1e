"""Changelog replay speed, and what the changelog costs a stateful function, on one pulsar-lite broker.

    .venv/bin/python bench/state_replay.py [--state-mb 50] [--value-bytes 5000] [--groups 128]
                                           [--rewrites 1] [--tail-fraction 0.1] [--messages 5000] [--repeats 3]

1. Writes about --state-mb of state (keys of --value-bytes each, spread over --groups key groups, each key
   written 1 + --rewrites times: the changelog's history) through a StateStore with its changelog, snapshots
   every group, then another store updates --tail-fraction of the keys (the tail).
   Then opens every group (a) in a new store by full changelog replay and (b) in the first store from its
   snapshots plus the tail: seconds, key groups/s, changelog MB/s, and checks both give the same state.
2. The word count example (5 words a message, 1,000 message keys) drains a backlog of --messages with the
   changelog (each ack after its records are persisted) and with the same store without a changelog, in the
   same run, alternating, --repeats times: median msgs/s and the ratio.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pulsar

from pulsar_autoscale.broker.embedded import EmbeddedBroker
from pulsar_autoscale.functions.instance.instance import Instance
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.state.changelog import Changelog, changelog_topic
from pulsar_autoscale.functions.state.store import StateStore

EXAMPLES = Path(__file__).resolve().parents[1] / "functions" / "examples"


def _put(store: StateStore, key: str, value: bytes) -> None:
    view = store.for_key(key)
    store.begin(view.group)
    view.put_state(key, value)
    store.commit()


def replay(client, tmp: Path, state_mb: float, value_bytes: int, groups: int, tail_fraction: float, rewrites: int) -> dict:
    topic = Changelog(changelog_topic("public", "default", f"replay-{uuid.uuid4().hex[:8]}"))
    keys = max(1, int(state_mb * 1e6 / value_bytes))
    first = StateStore(tmp / "first" / "state.sqlite", groups)
    first.attach_changelog(client, topic)
    started = time.perf_counter()
    for i in range(keys * (1 + rewrites)):  # history: every key written 1 + rewrites times
        _put(first, f"key-{i % keys}", os.urandom(value_bytes))
        if i % 500 == 499:
            first.flush()
    first.flush()
    write_s = time.perf_counter() - started
    everything = set(range(groups))
    first.release(everything)  # flush + snapshot every group + forget them here
    new_owner = StateStore(tmp / "other" / "state.sqlite", groups, owned=set())
    new_owner.attach_changelog(client, topic)
    new_owner.open(everything)  # the owner while `first` is away: full replay
    tail = int(keys * tail_fraction)
    for i in range(tail):
        _put(new_owner, f"key-{i * keys // max(tail, 1)}", os.urandom(value_bytes))
    new_owner.flush()
    expected = new_owner.rows()

    full = StateStore(tmp / "full" / "state.sqlite", groups, owned=set())
    full_stats = full.open(everything, client=client, changelog=topic)
    assert full.rows() == expected, "full replay differs from the state it replays"
    snap_stats = first.open(everything)  # back on `first`: its snapshots + the tail
    assert first.rows() == expected, "snapshot + tail differs from the state it restores"

    def figures(s) -> dict:
        return {
            "seconds": round(s.seconds, 3),
            "key_groups_per_s": round(s.groups_per_s, 1),
            "changelog_mb_per_s": round(s.mb_per_s, 1),
            "records": s.records,
            "changelog_mb": round(s.bytes / 1e6, 1),
            "duplicates_skipped": s.duplicates,
            "groups_from_snapshot": s.from_snapshot,
            "snapshot_rows": s.snapshot_rows,
        }

    return {
        "state_mb": round(keys * value_bytes / 1e6, 1),
        "keys": keys,
        "key_groups": groups,
        "rewrites": rewrites,
        "tail_keys": tail,
        "write_s": round(write_s, 2),
        "full_replay": figures(full_stats),
        "snapshot_plus_tail": figures(snap_stats),
        "speedup": round(full_stats.seconds / snap_stats.seconds, 1) if snap_stats.seconds else None,
    }


class LocalOnlyStore(StateStore):
    """The store as it was before the changelog: local SQLite, nothing sent."""

    def attach_changelog(self, client, topic) -> None:
        pass


def throughput(client, tmp: Path, messages: int, store_cls) -> float:
    name = f"wc-{uuid.uuid4().hex[:8]}"
    cfg = FunctionConfig.from_dict(
        {
            "tenant": "public",
            "namespace": "default",
            "name": name,
            "className": "word_count.WordCount",
            "inputs": [f"{name}-in"],
            "subscriptionPosition": "Earliest",
        }
    )
    topic = cfg.inputs[0]
    producer = client.create_producer(topic, batching_enabled=True, block_if_queue_full=True)
    for i in range(messages):
        producer.send_async(f"w{i % 97} w{i % 89} w{i % 83} w{i % 79} w{i % 73}".encode(), None, partition_key=f"k{i % 1000}")
    producer.flush()
    producer.close()
    store = store_cls(tmp / name / "state.sqlite", cfg.numKeyGroups)
    instance = Instance(cfg, 0, client, str(EXAMPLES / "word_count.py"), store, lambda: 1)
    runner = threading.Thread(target=instance.run, daemon=True)
    started = time.perf_counter()
    runner.start()
    while instance.stats.processed < messages:
        if not runner.is_alive():
            raise RuntimeError(f"instance stopped: {instance.stats.figures().error}")
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    instance.stop()
    runner.join(30)
    assert sum(store.counters().values()) == 5 * messages
    return messages / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-mb", type=float, default=50.0)
    ap.add_argument("--value-bytes", type=int, default=5000)
    ap.add_argument("--groups", type=int, default=128)
    ap.add_argument("--tail-fraction", type=float, default=0.1)
    ap.add_argument("--rewrites", type=int, default=1, help="times every key is written again before the snapshot")
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="state-replay-") as tmp, EmbeddedBroker() as broker:
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        result = {
            "replay": replay(client, Path(tmp), args.state_mb, args.value_bytes, args.groups, args.tail_fraction, args.rewrites)
        }
        local, logged = [], []
        for _ in range(args.repeats):  # alternating, so that load from elsewhere hits both alike
            local.append(throughput(client, Path(tmp), args.messages, LocalOnlyStore))
            logged.append(throughput(client, Path(tmp), args.messages, StateStore))
        result["throughput"] = {
            "messages": args.messages,
            "updates_per_message": 5,
            "repeats": args.repeats,
            "local_only_msgs_per_s": round(statistics.median(local), 1),
            "with_changelog_msgs_per_s": round(statistics.median(logged), 1),
            "ratio": round(statistics.median(logged) / statistics.median(local), 3),
            "runs_local_only": [round(x) for x in local],
            "runs_with_changelog": [round(x) for x in logged],
        }
        client.close()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
