"""`pulsar-autoscale produce|consume`: pulsar-client's produce and consume, with its flag names.

produce TOPIC -m "a,b" [-n N] [-r RATE] [-k KEY] [-p k=v]: sends the messages N times each round.
consume TOPIC -s SUB [-n N] [-t Shared] [-p Earliest]: prints each message as pulsar-client does;
-n 0 consumes until Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import time

import pulsar

from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.pulsar_client import (
    CLIENT_LOGGER,
    add_client_arguments,
    broker_error,
    open_client,
    settings_from_args,
)

DEFAULT_SERVICE_URL = "pulsar://127.0.0.1:6650"
# a broker that does not answer fails the command within this long, in one line (the client's default: 30 s)
OPERATION_TIMEOUT_S = 10
SUBSCRIPTION_TYPES = {
    "Exclusive": pulsar.ConsumerType.Exclusive,
    "Shared": pulsar.ConsumerType.Shared,
    "Failover": pulsar.ConsumerType.Failover,
    "Key_Shared": pulsar.ConsumerType.KeyShared,
}


def configure_parser(p: argparse.ArgumentParser) -> None:
    """One module for both commands: the parser's prog ends with the command's name."""
    add_client_arguments(p, service_url_required=False)
    p.add_argument("topic", help="topic name (short names are persistent://public/default/NAME)")
    if p.prog.split()[-1] == "produce":
        p.add_argument(
            "-m", "--messages", action="append", default=[], help="messages to send, separated by --separator (repeatable)"
        )
        p.add_argument("-s", "--separator", default=",", help="separator of --messages (default ,)")
        p.add_argument("-n", "--num-produce", type=int, default=1, help="send the messages this many times")
        p.add_argument("-r", "--rate", type=float, default=0, help="messages per second (0: as fast as possible)")
        p.add_argument("-k", "--key", default=None, help="partition key of every message")
        p.add_argument("-p", "--properties", action="append", default=[], help="a property k=v (repeatable)")
    else:
        p.add_argument("-s", "--subscription-name", required=True, help="subscription name")
        p.add_argument("-n", "--num-messages", type=int, default=1, help="messages to receive (0: until Ctrl-C)")
        p.add_argument(
            "-t",
            "--subscription-type",
            default="Shared",
            choices=list(SUBSCRIPTION_TYPES),
            help="default Shared (pulsar-client's default is Exclusive)",
        )
        p.add_argument("-p", "--subscription-position", default="Latest", choices=["Latest", "Earliest"])
        p.add_argument(
            "--timeout", type=float, default=0, help="give up after this many seconds without a message (0: wait forever)"
        )


def _settings(args):
    args.service_url = args.service_url or DEFAULT_SERVICE_URL
    return settings_from_args(args)


def run(args: argparse.Namespace) -> int:
    """A failed client call ends the command with one line naming the broker; the client's own log lines
    (a retry per second against a broker that is down) only with -v."""
    if not args.verbose:
        logging.getLogger(CLIENT_LOGGER).setLevel(logging.CRITICAL)
    try:
        return produce(args) if args.command == "produce" else consume(args)
    except pulsar.PulsarException as exc:
        raise broker_error(args.service_url, exc) from None


def _open(args: argparse.Namespace) -> pulsar.Client:
    return open_client(_settings(args), operation_timeout_seconds=OPERATION_TIMEOUT_S)


def produce(args: argparse.Namespace) -> int:
    messages = [m for text in args.messages for m in text.split(args.separator)]
    if not messages:
        raise ConfigError("produce: give the messages with -m/--messages, e.g. -m 'hello,world'")
    if args.num_produce < 1:
        raise ConfigError(f"--num-produce must be at least 1, got {args.num_produce}")
    try:
        properties = dict(p.split("=", 1) for p in args.properties)
    except ValueError:
        raise ConfigError(f"--properties must be k=v, got {args.properties}") from None
    client = _open(args)
    failed: list = []
    try:
        # Asynchronous sends on a schedule: --rate holds even when the broker answers slowly.
        producer = client.create_producer(args.topic, block_if_queue_full=True)
        interval = 1.0 / args.rate if args.rate > 0 else 0.0
        kwargs = {"partition_key": args.key} if args.key else {}

        def sent_or_failed(res, _msg_id) -> None:
            if res != pulsar.Result.Ok:
                failed.append(res)

        sent, start = 0, time.monotonic()
        for _ in range(args.num_produce):
            for m in messages:
                if interval:
                    time.sleep(max(0.0, start + sent * interval - time.monotonic()))
                producer.send_async(m.encode(), sent_or_failed, properties=properties or None, **kwargs)
                sent += 1
        producer.flush()
        producer.close()
    finally:
        client.close()
    if failed:
        raise PulsarAutoscaleError(f"{len(failed)} of {sent} messages were not produced to {args.topic}: {failed[0]}")
    print(f"{sent} messages successfully produced to {args.topic}", flush=True)
    return 0


def consume(args: argparse.Namespace) -> int:
    client = _open(args)
    received = 0
    try:
        consumer = client.subscribe(
            args.topic,
            args.subscription_name,
            consumer_type=SUBSCRIPTION_TYPES[args.subscription_type],
            initial_position=getattr(pulsar.InitialPosition, args.subscription_position),
        )
        while args.num_messages == 0 or received < args.num_messages:
            try:
                msg = consumer.receive(int(args.timeout * 1000)) if args.timeout else consumer.receive()
            except pulsar.Timeout:
                break
            print(
                f"----- got message -----\nkey:[{msg.partition_key() or 'null'}], "
                f"properties:[{', '.join(f'{k}={v}' for k, v in msg.properties().items())}], "
                f"content:{msg.data().decode('utf-8', 'replace')}",
                flush=True,
            )
            consumer.acknowledge(msg)
            received += 1
        consumer.close()
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    print(f"{received} messages successfully consumed", flush=True)
    return 0 if args.num_messages == 0 or received >= args.num_messages else 1
