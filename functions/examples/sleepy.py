"""Emulates a call to a model server: waits a service time drawn from a distribution, then passes the input on.

userConfig: `service_ms` (mean, default 20), `dist` (exponential | lognormal | deterministic, default
exponential), `cv` (coefficient of variation for lognormal, default 1). Waiting rather than spinning
lets threads scale on two cores (a function that spins, spin.py, cannot scale past the cores).
"""

import math
import random
import time

from pulsar import Function


class Sleepy(Function):
    def process(self, input, context):
        mean_s = float(context.get_user_config_value("service_ms") or 20) / 1000.0
        dist = context.get_user_config_value("dist") or "exponential"
        if dist == "deterministic":
            wait = mean_s
        elif dist == "lognormal":
            cv = float(context.get_user_config_value("cv") or 1.0)
            sigma2 = math.log(1 + cv * cv)
            wait = random.lognormvariate(math.log(mean_s) - sigma2 / 2, math.sqrt(sigma2))
        else:
            wait = random.expovariate(1.0 / mean_s)
        time.sleep(wait)
        return input
