"""pulsar-autoscale: elastic Apache Pulsar Functions in Python."""

__version__ = "0.1.0"
