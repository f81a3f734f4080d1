"""free_port never hands the same port out twice in one process: the harness asks for a few in a
row (etcd's client and peer ports, the hub's three, a service and its fake hub) and binds them
later, and the kernel gives a port again once its probe socket is closed (a unit run here: the
service fixture met "Address already in use" when its two ports were one)."""

from __future__ import annotations

import socket

from gpushare_hub.service.address import free_port


def test_ports_asked_for_in_turn_are_all_different_and_free():
    ports = [free_port() for _ in range(3000)]
    assert len(set(ports)) == len(ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[-1]))  # nothing holds it
