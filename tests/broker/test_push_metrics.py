"""The pushes' latency as /metrics tells it, in prometheus-client's multiprocess mode
(as `./run` runs the processes): measured in the web process that wrote the push."""

from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from broker.services.events import publish_event
from broker.services.operators import issue_operator_token
from tests.broker.agent_helpers import ISSUER, agent_url
from tests.broker.tree_helpers import wait_until_idle
from tests.cast import AUDITOR, create_member

pytestmark = pytest.mark.django_db(transaction=True)

STATUS = {"kind": "command", "action": "status"}


def scraped(base_url: str, token: str) -> dict[str, float]:
    request = urllib.request.Request(
        f"{base_url}/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


def test_a_web_process_in_multiprocess_mode_tells_the_latency_of_the_pushes_it_wrote(
    cast, serve_console, tmp_path
):
    folder = tmp_path / "metrics"
    folder.mkdir()
    token = issue_operator_token(user=create_member(AUDITOR), label="prometheus", actor=ISSUER)
    with (
        serve_console({"PROMETHEUS_MULTIPROC_DIR": str(folder)}) as base,
        connect(agent_url(base), open_timeout=10) as agent,
    ):
        agent.send(json.dumps({"type": "login", "token": cast["server"], "ref": "in"}))
        assert [json.loads(agent.recv(timeout=10))["type"] for _ in range(2)] == [
            "welcome", "replayed",
        ]  # fmt: skip
        before = scraped(base, token)
        publish_event(sender=cast["controller_client"], content=STATUS,
                      selector='receiver.hostname == "web-00000"')  # fmt: skip
        wait_until_idle()
        assert json.loads(agent.recv(timeout=10))["type"] == "notification"
        after = scraped(base, token)
    assert after["sn_push_seconds_count"] == before.get("sn_push_seconds_count", 0) + 1
    assert 0 <= after["sn_push_seconds_sum"] < 10
    assert after["sn_agents_connected"] >= 1
    assert any(path.name.startswith("histogram_") for path in folder.iterdir())
