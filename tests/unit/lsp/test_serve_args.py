"""`draftline serve --tcp`: an address it cannot use is one clear line and exit status 2, not a traceback."""

from __future__ import annotations

import argparse
import socket

import pytest

from lsp_server.server import run_serve, tcp_address


def serve(tcp: str) -> int:
    return run_serve(argparse.Namespace(tcp=tcp, stdio=False, metrics_port=None, config=None, verbose=True))


@pytest.mark.parametrize("value, complaint", [
    ("localhost", "--tcp wants HOST:PORT"),
    ("127.0.0.1:", "--tcp wants HOST:PORT"),
    ("127.0.0.1:http", "--tcp wants HOST:PORT"),
    ("127.0.0.1:99999", "the port must be between 0 and 65535"),
])
def test_an_address_that_is_no_host_and_port_is_refused_in_one_line(capsys, value, complaint):
    assert serve(value) == 2
    err = capsys.readouterr().err
    assert err.startswith("draftline serve: ") and complaint in err and "Traceback" not in err


def test_a_port_in_use_is_refused_in_one_line(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve(f"127.0.0.1:{port}") == 2
    err = capsys.readouterr().err
    assert err.strip() == f"draftline serve: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_an_ipv6_host_may_come_in_brackets_and_no_host_is_loopback():
    assert tcp_address("[::1]:0") == ("::1", 0)
    assert tcp_address("::1:7333") == ("::1", 7333)
    assert tcp_address(":7333") == ("127.0.0.1", 7333)
    assert tcp_address("0.0.0.0:0") == ("0.0.0.0", 0)
