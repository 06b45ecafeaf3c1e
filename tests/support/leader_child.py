"""Child of the leader SIGSTOP scenario: a LeaderElector that prints LEADER <epoch> / LOST as its term changes."""

import sys
import time

from pulsar_autoscale.leader import LeaderElector

elector = LeaderElector(sys.argv[1], lock_topic=sys.argv[2], identity=sys.argv[3])
leading = False
while True:
    term = elector.try_acquire()
    if term and not leading:
        print(f"LEADER {term.epoch} {time.time():.3f}", flush=True)
        leading = True
    if leading and not elector.check():
        print(f"LOST {time.time():.3f}", flush=True)
        leading = False
    time.sleep(0.1)
