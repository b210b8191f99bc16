"""tritonshare's mutating webhook in the simulated cluster: its arguments and its configuration.

`SimCluster(webhook=True)` runs `python -m webhook` with the arguments of the chart's Deployment
and registers the chart's MutatingWebhookConfiguration, so a pod written in the short form (a few
annotations) is completed by the product's own webhook, called by the simulated API server over
HTTPS. Two things differ from the chart, both because the simulation has one address for every
node: the webhook is reached at a `url` (there is no cluster DNS for `clientConfig.service`), and
the agent and gateway ports it writes into pods are those of the one node that runs pods, not the
hostPorts 8100/8010/8011; its logs are text, as every part's in the simulation.
`tests/webhook/test_in_cluster.py` checks the rest against the chart. Owns the arguments, the
configuration, starting the process and registering it once it serves; `sim.cluster` decides when.
"""

from __future__ import annotations

import base64
import ssl
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client

from common.contract import DEFAULT_PREFIX, DEFAULT_SCHEDULER_NAME, DEFAULT_SYSTEM_NAMESPACE
from common.version import VERSION
from sim.processes import ManagedProcess, wait_started
from sim.triton import free_port

CONFIGURATION_NAME = "tritonshare-model-pods"
WEBHOOK_NAME = "model-pods.tritonshare.io"
TLS_SECRET_NAME = "tritonshare-webhook-tls"  # noqa: S105 - a Secret's name
PATH = "/mutate-pods"
IMAGE = f"ghcr.io/tritonshare/tritonshare:{VERSION}"
STORAGE_INITIALIZER_IMAGE = "kserve/storage-initializer:v0.14.1"
# The chart's webhook.excludeNamespaces default, besides its own namespace.
EXCLUDED_NAMESPACES = ("kube-system",)


@dataclass(frozen=True)
class NodePorts:
    """Where the node that runs pods serves what model pods call."""

    agent: int
    gateway_http: int
    gateway_grpc: int


@dataclass
class WebhookHandle:
    """The webhook's process, and the certificate its callers trust."""

    process: ManagedProcess
    url: str
    """https://host:port, without a path."""
    ca: Path
    """Its serving certificate, which is its own CA."""
    key: Path


def arguments(port: int, cert: Path, key: Path, ports: NodePorts) -> list[str]:
    """`python -m webhook`'s arguments, as the chart's Deployment passes them (but the floor on
    on-demand pods' idle time); the images go in its environment (`environment`), as there."""
    return [
        f"--listen=127.0.0.1:{port}",
        f"--tls-cert={cert}",
        f"--tls-key={key}",
        f"--key-prefix={DEFAULT_PREFIX}",
        f"--scheduler-name={DEFAULT_SCHEDULER_NAME}",
        f"--agent-port={ports.agent}",
        f"--triton-http-port={ports.gateway_http}",
        f"--triton-grpc-port={ports.gateway_grpc}",
        "--default-idle-seconds=300",
        # Tests, benchmarks and the demo ask for idle times of seconds, not minutes.
        "--min-idle-seconds=1",
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


def environment() -> dict[str, str]:
    """The images the webhook writes into pods, as the chart's Deployment passes them: in
    variables, which a kustomize overlay's `images:` rewrites."""
    return {
        "TRITONSHARE_IMAGE": IMAGE,
        "TRITONSHARE_STORAGE_INITIALIZER_IMAGE": STORAGE_INITIALIZER_IMAGE,
    }


def start(
    log_dir: Path, env: Mapping[str, str], cert: Path, key: Path, ports: NodePorts
) -> WebhookHandle:
    """Start `python -m webhook` on a free port (log `webhook.log`); it is not waited for."""
    port = free_port()
    argv = [sys.executable, "-m", "webhook", *arguments(port, cert, key, ports)]
    process = ManagedProcess("webhook", argv, log_dir / "webhook.log")
    process.start({**env, **environment()})
    return WebhookHandle(process, f"https://127.0.0.1:{port}", cert, key)


def _serving(webhook: WebhookHandle, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(  # noqa: S310  (https, the sim's own URL)
            f"{webhook.url}/healthz", context=context, timeout=2
        ) as answer:
            return int(answer.status) == 200
    except OSError:
        return False


def register(webhook: WebhookHandle, api: kubernetes.client.ApiClient) -> None:
    """Wait until the webhook serves, then create its configuration: from then on the API server
    sends it every model pod created. ClusterError if it exits first."""
    context = ssl.create_default_context(cafile=str(webhook.ca))
    serving = partial(_serving, webhook, context)
    wait_started(webhook.process, "the webhook", serving)
    admission = cast(Any, kubernetes.client.AdmissionregistrationV1Api(api))
    body = configuration(webhook.url + PATH, webhook.ca.read_bytes())
    admission.create_mutating_webhook_configuration(body, _preload_content=False)
    # The serving certificate's Secret, as the chart creates it (the process reads the files).
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": TLS_SECRET_NAME, "namespace": DEFAULT_SYSTEM_NAMESPACE},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(webhook.ca.read_bytes()).decode(),
            "tls.key": base64.b64encode(webhook.key.read_bytes()).decode(),
        },
    }
    core = cast(Any, kubernetes.client.CoreV1Api(api))
    core.create_namespaced_secret(DEFAULT_SYSTEM_NAMESPACE, secret, _preload_content=False)
