"""`draftline bench remote-cancel` against the in-test server: the counts it reports add up."""

from __future__ import annotations

import argparse
import json

import pytest

from engine.bench import remote_cancel
from engine.sse_server import SSEServer


def test_the_bench_counts_tokens_after_the_keystroke_from_the_servers_metrics(capsys):
    with SSEServer(chunks=[f" t{i}" for i in range(300)]) as server:
        server.delay_s = 0.004  # a token's time, so the stream is still going when the key comes
        args = argparse.Namespace(trials=3, after=5, url=server.url, model="m", server=None, gguf="", threads=1, json=True)
        assert remote_cancel.run_bench_remote_cancel(args) == 0
        sent = server.sent
    report = json.loads(capsys.readouterr().out)
    runs = report["runs"]
    assert len(runs) == 3 and report["all_cancelled"]
    for run in runs:
        assert run["received"] >= 5  # the keystroke came after --after pieces
        assert run["generated"] >= run["received"]  # the server's counter saw at least what arrived
        assert run["after"] == run["generated"] - run["received"]
        assert run["generated"] < 300  # the stream stopped long before its end
    assert sum(run["generated"] for run in runs) == sent  # the counter is the server's own, nothing else
    assert report["after_keystroke"]["max"] == max(run["after"] for run in runs)


def test_metrics_without_a_token_counter_is_a_clear_error():
    class Http:
        def get(self, path):
            return argparse.Namespace(text="other_metric 1\n")

    with pytest.raises(RuntimeError, match="--metrics"):
        remote_cancel._counter(Http())
