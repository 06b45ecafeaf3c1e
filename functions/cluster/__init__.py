"""A cluster of function workers that coordinate through Pulsar topics only.

One class per role, as Apache Pulsar's functions workers have:

- `membership.MembershipManager`: every worker announces itself and heartbeats on the
  membership topic; a worker is dead after `heartbeat_timeout_s` without one.
- `metadata.FunctionMetaDataManager`: function configs on the metadata topic and code on the
  package topic, read by every worker from the start; any worker writes, versions decide.
- `scheduler`: pure placement functions (round-robin, least-loaded, capacity).
- `assignments.AssignmentTailer`: the leader's placement snapshots, fenced by epoch.
- `member.ClusterMember`: glues them to the local `Worker` and answers the admin API for the
  whole cluster (status/stats of remote instances are read from their worker over HTTP).
- `peers.Peers`: those reads of other workers, `?scope=local`, and of the state keys they hold.
"""
