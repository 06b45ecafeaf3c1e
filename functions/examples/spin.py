"""A CPU-bound function: burns `work_ms` (userConfig, default 5) of CPU per message, then passes it on."""

import time

from pulsar import Function


class Spin(Function):
    def process(self, input, context):
        end = time.process_time() + float(context.get_user_config_value("work_ms") or 5) / 1000.0
        x = 0
        while time.process_time() < end:
            x += 1
        return input
