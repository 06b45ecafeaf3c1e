"""pulsar-lite's defects, fenced (docs/dev/pulsar-lite-defects.md, tests/integration/broker_conformance/): one module per mechanism.

Everything else in the project is written for Apache Pulsar's documented behaviour. A fence here is
switched on only where the worker's broker profile (broker/profile.py) says so, and is correct, if less
parallel, on a real cluster too:

- incarnation: consumer-id floors for every client that consumes next to others (B2 between clients, B14)
- shared_input: process instances receive through the worker's one consumer (B2 within a worker)
- nack_redelivery: a FAILOVER input redelivers its nacked messages itself (B13)
- stalls: an input the broker stopped dispatching to is reopened (B12)
- function_limits: config fields pulsar-lite cannot honour are refused (B5, B9)
- startup: the metrics server lost to a taken port (B15)
- readers: reader queues never under 2 (B16)
"""
