"""The partition harness from Python (`Link`, conftest.py): a call through a frozen link waits
without failing, and completes once the link heals."""

from __future__ import annotations

import threading

import rdzv
from conftest import Link


def test_a_call_through_a_frozen_link_waits_and_completes_once_healed(endpoint: str, run_id: str) -> None:
    scheme, _, server = endpoint.partition("://")
    with Link(server) as link:
        store = rdzv.open_store(f"{scheme}://{link.endpoint_list}/{run_id}")
        store.set("before", "1")
        link.freeze()
        got: list[bytes] = []
        call = threading.Thread(target=lambda: got.append(store.get("before")))
        call.start()
        call.join(1.0)
        assert call.is_alive() and not got, "a call went through a frozen link"
        link.heal()
        call.join(20)
        assert got == [b"1"]
        assert link.cut() >= 1
