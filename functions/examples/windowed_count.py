"""A keyed tumbling-window count (a keyedState function): per key, the count of its records in the current
window of `window_s` seconds, kept in a state value padded to `state_bytes` (so the state has a realistic
size); a record in a new window starts a new count. Output: `key:window:count`. Optional `service_ms`
of sleep per record, a stand-in for the work that sets the function's capacity."""

import time

from pulsar import Function


class WindowedCount(Function):
    def process(self, input, context):
        cfg = context.get_user_config_map()
        window_s = float(cfg.get("window_s", 10))
        size = int(cfg.get("state_bytes", 64))
        key = context.get_message_key() or ""
        window = int((context.get_message_eventtime() or int(time.time() * 1000)) / 1000 // window_s)
        old = context.get_state(key)
        count = 1
        if old:
            w, c, _ = bytes(old).split(b":", 2)
            if int(w) == window:
                count = int(c) + 1
        head = b"%d:%d:" % (window, count)
        context.put_state(key, head + b"." * max(size - len(head), 0))
        service_ms = float(cfg.get("service_ms", 0))
        if service_ms:
            time.sleep(service_ms / 1000)
        return f"{key}:{window}:{count}"
