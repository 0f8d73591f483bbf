"""Tests of distcomm.backend.ports: a free TCP port for a rendezvous."""

from __future__ import annotations

import socket

import pytest

from distcomm.backend import free_port


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_the_port_is_free_to_bind_and_listen_on(host: str) -> None:
    port = free_port(host)
    assert isinstance(port, int) and 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind((host, port))
        server.listen()
        assert server.getsockname()[1] == port


def test_the_default_host_is_the_loopback() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass


def test_a_port_in_use_is_not_given() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        used = taken.getsockname()[1]
        assert all(free_port() != used for _ in range(20))
