"""The seed scenario, examples/paused_worker.py, against one server (the
cluster run is in test_cluster.py): the paused worker's late write is
refused, its ``lost`` fired no later than its first call after waking, and
the stream holds only the new holder's records after the takeover."""

from __future__ import annotations

from conftest import Server
from test_cluster import run_example


def test_paused_worker_example(server: Server, name: str) -> None:
    summary = run_example(["--port", str(server.port), "--stream", name])
    assert summary["stream"] == name
    assert [r[2] for r in summary["records"]] == ["A: step 1", "B: step 1", "B: step 2"]
    assert summary["a_lost_reason"] == "not renewed in time"
