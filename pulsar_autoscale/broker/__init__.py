"""The broker side: the embedded pulsar-lite (embedded), its known defects fenced (lite/), which
fences apply to which broker (profile), its Prometheus metrics."""
