"""The simulator: a discrete-event model of an app (engine) under a workload, driven by the controller's own policy code."""
