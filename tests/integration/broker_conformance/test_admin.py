"""The admin REST API a real broker serves next to its metrics. The controller reads topic stats from
it on Apache Pulsar (stock mode); on pulsar-lite it reads /metrics instead, because there is none."""

from __future__ import annotations

import pytest
import requests

from tests.support.conformance import client, produce


@pytest.mark.lite_defect(reason="pulsar-lite B7: no admin REST API (topic stats, functions); only /metrics")
def test_topic_stats_over_the_admin_api(broker, topic):
    with client(broker.service_url) as c:  # a real broker answers 404 for a topic never created
        produce(c, topic, 3)
    base = broker.metrics_url.rsplit("/metrics", 1)[0]
    path = topic.replace("persistent://", "")
    resp = requests.get(f"{base}/admin/v2/persistent/{path}/stats", timeout=5)
    assert resp.status_code == 200 and resp.json()["msgInCounter"] == 3
