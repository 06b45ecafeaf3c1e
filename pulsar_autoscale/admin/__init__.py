"""REST clients: our worker's Functions API (client), stock Apache Pulsar (stock), and HTTP auth for both."""
