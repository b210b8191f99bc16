"""The webhook serves AdmissionReviews over real HTTPS (a certificate made with openssl, as
cert-manager would issue one): a client trusting the CA gets the patch, one that does not is
refused by TLS, and `python -m webhook` refuses to start without a certificate."""

from __future__ import annotations

import base64
import copy
import json
import logging
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import require_executable
from webhook.server import tls_context, webhook_server
from webhook.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def make_certificate(directory: Path) -> tuple[Path, Path]:
    openssl = require_executable("openssl")
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=tritonshare-webhook.tritonshare-system.svc",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


REVIEW = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "namespace": "models",
        "object": {
            "metadata": {
                "name": "m",
                "annotations": {
                    "tritonshare.io/model-uri": "gs://b/add_one",
                    "tritonshare.io/gpu-mem": "1Gi",
                },
            },
            "spec": {"containers": []},
        },
    },
}


async def test_admission_reviews_over_https(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = make_certificate(tmp_path)
    server = webhook_server(Settings(listen=("127.0.0.1", 0)), tls_context(cert, key))
    await server.start()
    try:
        url = f"https://127.0.0.1:{server.port}/mutate-pods"
        trusting = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=REVIEW, ssl=trusting) as answer:
                assert answer.status == 200
                body = await answer.json()
            response = body["response"]
            assert response["uid"] == "u-1" and response["allowed"] is True
            operations = json.loads(base64.b64decode(response["patch"]))
            assert {"op": "replace", "path": "/spec/containers"} in [
                {k: o[k] for k in ("op", "path")} for o in operations
            ]
            async with session.post(url, data=b"not json", ssl=trusting) as answer:
                assert answer.status == 400
            # A refusal is logged naming the pod, with pod, namespace and model as fields.
            bad: dict[str, Any] = copy.deepcopy(REVIEW)
            annotations = bad["request"]["object"]["metadata"]["annotations"]
            annotations.update(
                {"tritonshare.io/gpu-mem": "x", "tritonshare.io/model-id": "add_one"}
            )
            with caplog.at_level(logging.INFO, logger="webhook"):
                async with session.post(url, json=bad, ssl=trusting) as answer:
                    assert (await answer.json())["response"]["allowed"] is False
            [refused] = [r for r in caplog.records if r.getMessage().startswith("Refused pod")]
            assert refused.getMessage().startswith("Refused pod models/m: annotation")
            fields = {k: refused.__dict__.get(k) for k in ("pod", "namespace", "model")}
            assert fields == {"pod": "m", "namespace": "models", "model": "add_one"}
            health = f"https://127.0.0.1:{server.port}"
            for path in ("/healthz", "/readyz"):
                async with session.get(health + path, ssl=trusting) as answer:
                    assert answer.status == 200
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.post(url, json=REVIEW, ssl=ssl.create_default_context())
    finally:
        await server.stop()


def test_the_webhook_will_not_serve_without_a_certificate(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "webhook", "--listen", "127.0.0.1:0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--tls-cert and --tls-key are required" in run.stderr
    missing = tmp_path / "absent.crt"
    run = subprocess.run(
        [sys.executable, "-m", "webhook", "--tls-cert", str(missing), "--tls-key", str(missing)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2 and f"cannot use the TLS certificate {missing}" in run.stderr
