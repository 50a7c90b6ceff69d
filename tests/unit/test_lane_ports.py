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


def test_a_port_in_use_is_skipped(monkeypatch) -> None:
    monkeypatch.setenv("SPMD_TEST_PORT_LANE", "0")
    monkeypatch.setattr(server_process.os, "getpid", lambda: 7)  # the walk starts at a known port
    monkeypatch.setattr(server_process, "_port_walk", iter(range(PORT_LANE_SPAN)))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", PORT_RANGE_START + 7))
        (port,) = free_ports(1)
    assert port == PORT_RANGE_START + 8
