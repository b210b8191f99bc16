"""tritonshare's mutating webhook in the simulated cluster: its arguments and its configuration.

`SimCluster(webhook=True)` runs `python -m webhook` with the arguments of the chart's Deployment
and registers the chart's MutatingWebhookConfiguration, so a pod written in the short form (a few
annotations) is completed by the product's own webhook, called by the simulated API server over
HTTPS. Two things differ from the chart, both because the simulation has one address for every
node: the webhook is reached at a `url` (there is no cluster DNS for `clientConfig.service`), and
the agent and gateway ports it writes into pods are those of the one node that runs pods, not the
hostPorts 8100/8010/8011. `tests/webhook/test_in_cluster.py` checks the rest against the chart.
Pure: it builds lists and dicts.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.contract import DEFAULT_PREFIX, DEFAULT_SCHEDULER_NAME, DEFAULT_SYSTEM_NAMESPACE

CONFIGURATION_NAME = "tritonshare-model-pods"
WEBHOOK_NAME = "model-pods.tritonshare.io"
PATH = "/mutate-pods"
IMAGE = "ghcr.io/tritonshare/tritonshare:0.1.0"
STORAGE_INITIALIZER_IMAGE = "kserve/storage-initializer:v0.14.1"
# The chart's webhook.excludeNamespaces default, besides its own namespace.
EXCLUDED_NAMESPACES = ("kube-system",)


@dataclass(frozen=True)
class NodePorts:
    """Where the node that runs pods serves what model pods call."""

    agent: int
    gateway_http: int
    gateway_grpc: int


def arguments(port: int, cert: Path, key: Path, ports: NodePorts) -> list[str]:
    """`python -m webhook`'s arguments, as the chart's Deployment passes them."""
    return [
        f"--listen=127.0.0.1:{port}",
        f"--tls-cert={cert}",
        f"--tls-key={key}",
        f"--key-prefix={DEFAULT_PREFIX}",
        f"--scheduler-name={DEFAULT_SCHEDULER_NAME}",
        f"--image={IMAGE}",
        f"--storage-initializer-image={STORAGE_INITIALIZER_IMAGE}",
        f"--agent-port={ports.agent}",
        f"--triton-http-port={ports.gateway_http}",
        f"--triton-grpc-port={ports.gateway_grpc}",
        "--log-format=text",
    ]


def configuration(url: str, ca: bytes) -> dict[str, Any]:
    """The chart's MutatingWebhookConfiguration, calling `url` and trusting `ca` (PEM)."""
    excluded = [DEFAULT_SYSTEM_NAMESPACE, *EXCLUDED_NAMESPACES]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "timeoutSeconds": 10,
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": excluded,
                        }
                    ]
                },
                "objectSelector": {"matchLabels": {"tritonshare.io/role": "model"}},
            }
        ],
    }
