"""The pure checks of `tritonshare preflight`: certificates read from their DER as openssl reads
them, the Kubernetes version as EKS and GKE write it, the CNI named from its DaemonSet."""

from __future__ import annotations

import calendar
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from binder.cli.certificates import CertificateError, pem_certificates
from binder.cli.checks import cni_check, kubernetes_version
from binder.cli.gpunodes import chart_node_pod_requests, tolerates_gpu_node
from common.contract import Keys


def _openssl(*args: str) -> str:
    return subprocess.run(
        ["openssl", *args], check=True, capture_output=True, text=True, timeout=60
    ).stdout


def _date(text: str) -> float:
    """openssl's `notAfter=Nov 26 17:00:00 2027 GMT`."""
    return float(
        calendar.timegm(time.strptime(text.split("=", 1)[1].strip(), "%b %d %H:%M:%S %Y GMT"))
    )


@pytest.mark.parametrize("days", [1, 365, 40000])  # 40000 days: a GeneralizedTime past 2049
def test_validity_and_names_as_openssl_reads_them(tmp_path: Path, days: int) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    crt, key = tmp_path / "ca.crt", tmp_path / "ca.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", str(days), "-subj",
             "/CN=ca", "-keyout", str(key), "-out", str(crt))  # fmt: skip
    (certificate,) = pem_certificates(crt.read_bytes())
    assert certificate.not_after == _date(_openssl("x509", "-in", str(crt), "-noout", "-enddate"))
    assert certificate.not_before == _date(
        _openssl("x509", "-in", str(crt), "-noout", "-startdate")
    )
    assert certificate.issuer == certificate.subject  # self-signed
    two = pem_certificates(crt.read_bytes() * 2)
    assert len(two) == 2


@pytest.mark.parametrize(
    ("pem", "why"),
    [
        (b"", "holds no PEM certificate"),
        (b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----", "base64"),
        (b"-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----", "not an X.509"),
    ],
)
def test_unreadable_certificates_say_why(pem: bytes, why: str) -> None:
    with pytest.raises(CertificateError, match=why):
        pem_certificates(pem)


@pytest.mark.parametrize(
    ("version", "status"),
    [
        ({"major": "1", "minor": "29", "gitVersion": "v1.29.4"}, "fail"),
        ({"major": "1", "minor": "30+", "gitVersion": "v1.30.5-eks-ce1d5eb"}, "ok"),
        ({"major": "1", "minor": "33", "gitVersion": "v1.33.1-gke.1"}, "ok"),
        ({"major": "1", "minor": ""}, "warn"),
    ],
)
def test_kubernetes_versions(version: dict[str, Any], status: str) -> None:
    check = kubernetes_version(version)
    assert check.status == status
    if status == "fail":
        assert check.fix == "upgrade the cluster to Kubernetes 1.30 or newer"


def _ds(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "kube-system"}}


def test_cnis_by_their_daemonsets() -> None:
    assert cni_check([_ds("azure-cns"), _ds("kube-proxy")]).message.startswith(
        "Azure CNI: hostPorts through the CNI portmap plugin"
    )
    unknown = cni_check([_ds("cilium")])
    assert unknown.status == "warn" and unknown.message.startswith("Cilium: whether its hostPort")
    assert "unknown" in unknown.message
    assert cni_check([]).message.startswith("no known CNI DaemonSet found")


@pytest.mark.parametrize(
    ("toleration", "judged"),
    [
        ({"operator": "Exists"}, True),
        ({"operator": "Exists", "effect": "NoExecute"}, True),
        ({"operator": "Exists", "effect": "NoSchedule"}, False),  # never reaches the node
        ({"key": "tritonshare.io/gpu-node", "operator": "Exists"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, False),
    ],
)
def test_which_daemonsets_reach_gpu_nodes(toleration: dict[str, str], judged: bool) -> None:
    ds = {"spec": {"template": {"spec": {"tolerations": [toleration]}}}}
    assert tolerates_gpu_node(ds, Keys()) is judged


def test_the_charts_node_pod_by_gpu_count() -> None:
    gi = 1 << 30
    assert chart_node_pod_requests(1) == {"cpu": 2600, "memory": 32 * gi + 256 * 2**20}
    assert chart_node_pod_requests(8) == {"cpu": 16600, "memory": 256 * gi + 256 * 2**20}
    assert chart_node_pod_requests(3) == chart_node_pod_requests(1)
