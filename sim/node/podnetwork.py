"""The stand-in for a pod's own network namespace, for processes that share the host's network.

A real pod has a network namespace of its own: a server that listens on the any-address
(0.0.0.0) listens on the pod's IP, so every pod can use the same ports, and its connections leave
from the pod's IP, which is how a peer (the node gateway) knows the pod. The simulated kubelet
runs every pod's processes in the host's network, where 0.0.0.0 is every address of the machine
and connections leave from 127.0.0.1. So, for each pod not on the host network, it:

- rewrites the IPv4 any-address written in the pod spec (in a container's command, args and env
  values, as a whole address: `--listen-http=0.0.0.0:9000`) to the pod's IP; and
- sets the environment variables it was told name a process's source address (for tritonshare,
  `TRITONSHARE_SOURCE_ADDRESS`, which SimCluster passes) to the pod's IP, unless the container
  sets them itself.

With `masquerade`, the variables name the node's address instead, as a CNI that masquerades
node-local traffic makes it (the portmap plugin's SNAT, kube-proxy's masquerade rules, some eBPF
dataplanes): the pod's connections to a hostPort on its node arrive from the node's address.

What it cannot stand in for: a listener on a default the spec does not write (a program that
binds 0.0.0.0 on its own), a connection from a program that reads no such variable (it leaves
from 127.0.0.1), and the pod's own loopback (127.0.0.1 is the node's here). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# 0.0.0.0 as a whole address: not part of 10.0.0.0.1 or 0.0.0.01.
_ANY_RE = re.compile(r"(?<![\w.])0\.0\.0\.0(?![\w.])")


@dataclass(frozen=True)
class PodNetwork:
    """One pod's stand-in network namespace."""

    address: str
    """The pod's IP (status.podIP)."""
    source_variables: tuple[str, ...] = ()
    """Environment variables set to `source`, so processes that read them connect from it."""
    source: str = ""
    """The address the pod's connections leave from: `address`, or the node's under a
    masquerading CNI."""

    def rewrite(self, text: str) -> str:
        """`text` with the any-address replaced by the pod's IP."""
        return _ANY_RE.sub(self.address, text)

    def environment(self, declared: Mapping[str, str]) -> dict[str, str]:
        """The source-address variables the container does not declare itself."""
        return {
            name: self.source or self.address
            for name in self.source_variables
            if name not in declared
        }


def pod_network(
    pod_ip: str, host_ip: str, source_variables: Sequence[str] = (), *, masquerade: bool = False
) -> PodNetwork | None:
    """The stand-in for a pod with IP `pod_ip`; None for a pod on the host network (its IP is the
    node's), whose processes see the host's network as they would on a real node. With
    `masquerade`, its connections leave from the node's address `host_ip`."""
    if pod_ip == host_ip:
        return None
    return PodNetwork(pod_ip, tuple(source_variables), host_ip if masquerade else "")
