"""tests/support/server_process.free_ports: each test lane's ports come from its own slice below the
kernel's ephemeral range, distinct and bindable, so two lanes never race for one port."""

from __future__ import annotations

import socket

import pytest

from tests.support import server_process
from tests.support.server_process import PORT_LANE_SPAN, PORT_RANGE_START, free_ports


def _ephemeral_range() -> tuple[int, int]:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
    return low, high


@pytest.mark.parametrize("lane", [0, 1])
def test_each_lane_walks_its_own_slice_below_the_ephemeral_range(monkeypatch, lane: int) -> None:
    monkeypatch.setenv("SPMD_TEST_PORT_LANE", str(lane))
    ports = free_ports(5) + free_ports(5)
    base = PORT_RANGE_START + lane * PORT_LANE_SPAN
    assert all(base <= p < base + PORT_LANE_SPAN for p in ports), ports
    assert len(set(ports)) == 10, "a port was handed out twice"
    assert max(ports) < _ephemeral_range()[0]
    for p in ports:  # each is free: a server can bind it
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def _bound_with_a_free_successor() -> tuple[socket.socket, int]:
    """A socket bound to lane 0's port base + k whose next port is free too (another test server
    may hold any given port, so none is fixed), and k."""
    for k in range(7, PORT_LANE_SPAN - 1):
        busy = socket.socket()
        try:
            busy.bind(("127.0.0.1", PORT_RANGE_START + k))
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", PORT_RANGE_START + k + 1))
            return busy, k
        except OSError:
            busy.close()
    raise RuntimeError("no two free consecutive ports in lane 0")


def test_a_port_in_use_is_skipped(monkeypatch) -> None:
    monkeypatch.setenv("SPMD_TEST_PORT_LANE", "0")
    busy, k = _bound_with_a_free_successor()
    monkeypatch.setattr(server_process.os, "getpid", lambda: k)  # the walk starts at the busy port
    monkeypatch.setattr(server_process, "_port_walk", iter(range(PORT_LANE_SPAN)))
    with busy:
        (port,) = free_ports(1)
    assert port == PORT_RANGE_START + k + 1
