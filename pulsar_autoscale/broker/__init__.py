"""The broker side: the embedded pulsar-lite (embedded), its known defects (lite_quirks), its Prometheus metrics."""
