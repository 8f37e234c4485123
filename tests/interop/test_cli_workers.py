"""``locks`` names the BullMQ workers connected to a queue, as each runtime names its connections.

BullMQ for Node.js spells the queue's name in base64 in its client names,
bullmq-py as it is: the listing finds both, and no worker of another queue.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from actors import QueueKeys
from actors.cli import main
from tests.interop.peers import PREFIX

if TYPE_CHECKING:
    from tests.conftest import Server
    from tests.interop.peers import Peer


def test_the_listing_names_the_workers_of_the_queue_and_no_other(
    peer: Peer, engine_server: Server, keys: QueueKeys, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a worker of each runtime that took a job (it named its connection by then)
    peer.add(1)
    (held,) = peer.fetch(1)
    other = QueueKeys(keys.name + "-other", prefix=PREFIX)

    main(["locks", "--url", engine_server.url, "--queue", keys.name, "--prefix", PREFIX, "--json"])
    document = json.loads(capsys.readouterr().out)
    main(["locks", "--url", engine_server.url, "--queue", other.name, "--prefix", PREFIX, "--json"])
    elsewhere = json.loads(capsys.readouterr().out)

    # then the queue's listing has the lock and the unnamed worker's connection(s),
    assert [lock["job_id"] for lock in document["locks"]] == [held.id]
    assert document["workers"], document
    assert {worker["name"] for worker in document["workers"]} == {""}
    assert all(worker["addr"].startswith("127.0.0.1:") for worker in document["workers"])
    # and the listing of a queue whose name only begins with this one's has none.
    assert elsewhere["workers"] == []
