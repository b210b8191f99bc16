"""A certificate for the simulated cluster's own HTTPS servers (the webhook, the model store).

One self-signed certificate for the machine's loopback (IP 127.0.0.1, DNS localhost), made with
the `openssl` command, as a cluster admin makes one for a private CA: it is its own CA, so the
file is both the servers' chain and what their clients trust (the webhook configuration's
caBundle; the pods' SSL_CERT_FILE). Nothing else here: the servers load it themselves.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


class TlsUnavailableError(RuntimeError):
    """The `openssl` command is missing or failed; the message says which."""


def self_signed(directory: Path) -> tuple[Path, Path]:
    """Write `tls.crt` and `tls.key` (valid for a day) into `directory`; their paths."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise TlsUnavailableError("the openssl command is not installed (apt-get install openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "tls.crt", directory / "tls.key"
    result = subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=tritonshare-sim",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise TlsUnavailableError(f"openssl could not make a certificate: {result.stderr.strip()}")
    key.chmod(0o600)
    return cert, key
