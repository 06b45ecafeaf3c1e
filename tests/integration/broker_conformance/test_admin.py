"""The admin REST API a real broker serves next to its metrics. The controller reads topic stats from
it on Apache Pulsar (stock mode); on pulsar-lite it reads /metrics instead, because there is none."""

from __future__ import annotations

import pytest
import requests


@pytest.mark.lite_defect(reason="pulsar-lite B7: no admin REST API (topic stats, functions); only /metrics")
def test_topic_stats_over_the_admin_api(broker, topic):
    base = broker.metrics_url.rsplit("/metrics", 1)[0]
    path = topic.replace("persistent://", "")
    resp = requests.get(f"{base}/admin/v2/persistent/{path}/stats", timeout=5)
    assert resp.status_code == 200 and "msgInCounter" in resp.json()
