"""Capacity planning before production: measure the maximum sustainable throughput (MST) on a small
testbed, profile each function, and predict what a target rate needs (StreamBed's method, for Pulsar
Functions). The same planner code runs against a simulated testbed (simbed) and a live one (livebed)."""
