"""The controller: the MAPE loop (loop), Monitor, Autoscaler + Planner (Analyze, Plan), Executor, leader election."""
