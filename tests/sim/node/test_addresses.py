"""Pod addresses of the simulated kubelet: one per pod, never one in use, reused only when free."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from sim.node.addresses import LAST, AddressesExhaustedError, PodAddresses


def test_each_pod_gets_its_own_address_and_keeps_it() -> None:
    addresses = PodAddresses()
    a, b = addresses.take("uid-a"), addresses.take("uid-b")
    assert a != b
    assert addresses.take("uid-a") == a
    assert all(ipaddress.ip_address(x) in ipaddress.ip_network("127.0.0.0/8") for x in (a, b))
    assert "127.0.0.1" not in (a, b)
    addresses.give_back(a)
    addresses.give_back(b)


def test_a_freed_address_is_reused_only_when_no_new_one_is_left() -> None:
    addresses = PodAddresses(first=ipaddress.IPv4Address(int(LAST) - 1))
    a = addresses.take("a")
    addresses.give_back(a)
    b, c = addresses.take("b"), addresses.take("c")
    assert b != a and c == a  # the fresh one first, then the freed one
    with pytest.raises(AddressesExhaustedError):
        addresses.take("d")
    addresses.give_back(b)
    addresses.give_back(c)


def test_a_process_can_listen_on_and_connect_from_a_pod_address() -> None:
    addresses = PodAddresses()
    pod_a = addresses.take("a")
    with socket.socket() as server:
        server.bind((pod_a, 0))
        server.listen()
        source = str(ipaddress.IPv4Address(int(ipaddress.IPv4Address(pod_a)) + 1))
        with socket.create_connection(server.getsockname(), source_address=(source, 0)):
            accepted, peer = server.accept()
            accepted.close()
    addresses.give_back(pod_a)
    assert peer[0] == source


def test_an_address_where_another_process_holds_one_of_the_pods_ports_is_passed_over() -> None:
    first = ipaddress.IPv4Address("127.200.0.1")  # far from the simulated clusters' pods
    with socket.socket() as other:
        other.bind((str(first), 0))
        other.listen()
        port = other.getsockname()[1]
        addresses = PodAddresses(first=first)
        a = addresses.take("a", [port])
        assert a == str(first + 1)
        b = addresses.take("b")
        assert b == str(first + 2), "a passed-over address is not handed out"
        addresses.give_back(a)
        addresses.give_back(b)


def test_two_kubelets_of_the_machine_never_hand_out_one_address_at_once() -> None:
    """Two simulated clusters side by side (the tests' xdist workers run them): the second
    kubelet passes over the address the first holds, though no port is bound there yet, and
    gets it once the first gives it back."""
    first, second = PodAddresses(), PodAddresses()
    a = first.take("a")
    b = second.take("b")
    assert b != a
    first.give_back(a)
    second.give_back(b)
    again = PodAddresses(first=ipaddress.IPv4Address(a))
    assert again.take("c") == a
    again.give_back(a)
