"""HTTP headers of our own that both ends of an API share (the client and the server live in different wings)."""

EPOCH_HEADER = "X-Pulsar-Autoscale-Epoch"  # the controller leader's term: a deposed leader's writes are refused
PARTIAL_HEADER = "X-Pulsar-Autoscale-Partial"  # why: the leader's records could not be added, and why
