"""An unmodified pulsar.Function for bench/update_downtime.py: tags each input with who processed it and when.

Input: "seq,send_ts" (send_ts: the producer's wall clock, seconds). Output:
"seq,send_ts,instance_id,incarnation,proc_ts". The incarnation (pid and a random token drawn at the first
message) changes when an instance is restarted, so a restart is seen in the outputs, not inferred.
userConfig `service_ms` (default 2): a sleep per message, the function's work.
"""

import os
import time
import uuid

from pulsar import Function


class TagInstance(Function):
    def process(self, input, context):
        boot = getattr(self, "_incarnation", None)
        if boot is None:
            boot = self._incarnation = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        service_s = float(context.get_user_config_value("service_ms") or 2) / 1000.0
        if service_s > 0:
            time.sleep(service_s)
        text = input.decode() if isinstance(input, bytes) else str(input)
        return f"{text},{context.get_instance_id()},{boot},{time.time():.6f}"
