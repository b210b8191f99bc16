"""Pod addresses for the simulated kubelet: each pod its own IP in 127.0.0.0/8.

A real pod has its own network namespace and IP; the simulated ones share the host's, but Linux
answers on every address of 127.0.0.0/8, so a process can listen on, and connect from, an address
of its own there. The nodes keep 127.0.0.x (127.0.0.1 the first: its agent and gateway listen
there, and a pod on its host network gets it too); pods get addresses from 127.1.0.1 on, each
held until the pod is gone and then reused last, as a CNI's IPAM hands them out (one pool for
the kubelets of several nodes). Since a pod's ports are its own
only on its own address, an address where another process of the machine already holds one of
the pod's declared ports (another simulated cluster's pod, say, or a listener on 0.0.0.0) is
skipped, and so is one that another simulated kubelet of the machine holds (each held address is
claimed through `sim.claims`, released with it or when the process ends): two
clusters running side by side, as the tests' workers run them, never hand out one address while
the first pod's processes have not bound it yet. Thread-safe: pod workers take and give back
addresses from their own threads.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from collections import deque
from collections.abc import Iterable

from sim.claims import claim as _claim
from sim.claims import ports_free as _free

FIRST = ipaddress.IPv4Address("127.1.0.1")
LAST = ipaddress.IPv4Address("127.254.255.254")


class AddressesExhaustedError(RuntimeError):
    """Every pod address is in use."""


class PodAddresses:
    """Hands out pod IPs in 127.1.0.0-127.254.255.255, never one that is in use."""

    def __init__(self, first: ipaddress.IPv4Address = FIRST) -> None:
        self._next = int(first)
        self._freed: deque[str] = deque()
        self._in_use: dict[str, str] = {}
        self._claims: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, owner: str, ports: Iterable[int] = ()) -> str:
        """An address for pod `owner` (its uid), where each of its TCP `ports` is free; the same
        one if it already holds one."""
        wanted = tuple(ports)
        with self._lock:
            for address, holder in self._in_use.items():
                if holder == owner:
                    return address
            while True:
                if self._next <= int(LAST):
                    address = str(ipaddress.IPv4Address(self._next))
                    self._next += 1
                elif self._freed:
                    address = self._freed.popleft()
                else:
                    raise AddressesExhaustedError("every simulated pod address is in use")
                claim = _claim(address)
                if claim is None:
                    continue  # another simulated kubelet of the machine holds it
                if _free(address, wanted):
                    self._in_use[address] = owner
                    self._claims[address] = claim
                    return address
                os.close(claim)
                # Another process of the machine holds a port there: pass the address over.

    def give_back(self, address: str) -> None:
        """The pod holding `address` is gone."""
        with self._lock:
            if self._in_use.pop(address, None) is not None:
                self._freed.append(address)
            claim = self._claims.pop(address, None)
            if claim is not None:
                os.close(claim)  # releases the flock
