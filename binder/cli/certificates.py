"""What `tritonshare preflight` reads from an X.509 certificate: its issuer, subject and validity.

A few fields of PEM certificates (a webhook's caBundle, a TLS Secret's tls.crt) read straight from
their DER, so the CLI needs no cryptography package; nothing here verifies a signature. Pure.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import re
from dataclasses import dataclass

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL)


class CertificateError(ValueError):
    """Not a PEM certificate this module can read; says what is wrong."""


@dataclass(frozen=True)
class Certificate:
    issuer: bytes
    """The issuer Name's DER, compared as is against a CA's subject."""
    subject: bytes
    not_before: float
    """Unix seconds."""
    not_after: float


def pem_certificates(pem: bytes) -> list[Certificate]:
    """Every certificate of a PEM bundle, in order; CertificateError if there is none or one
    cannot be read."""
    blocks = _PEM.findall(pem)
    if not blocks:
        raise CertificateError("it holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    found = []
    for block in blocks:
        try:
            der = base64.b64decode(b"".join(block.split()), validate=True)
        except binascii.Error as e:
            raise CertificateError(f"a certificate's base64 cannot be read: {e}") from e
        found.append(_certificate(der))
    return found


def _certificate(der: bytes) -> Certificate:
    try:
        outer_start = _content(der, 0, 0x30)[0]
        tbs_start, tbs_end = _content(der, outer_start, 0x30)
        at = tbs_start
        if der[at] == 0xA0:  # [0] EXPLICIT version
            at = _content(der, at, 0xA0)[1]
        at = _content(der, at, 0x02)[1]  # serialNumber
        at = _content(der, at, 0x30)[1]  # signature algorithm
        issuer, at = _element(der, at, 0x30)
        validity_start, validity_end = _content(der, at, 0x30)
        subject, _ = _element(der, validity_end, 0x30)
        not_before, after_at = _time(der, validity_start)
        not_after, _ = _time(der, after_at)
    except (IndexError, ValueError) as e:
        raise CertificateError(f"its DER is not an X.509 certificate ({e})") from e
    if validity_end > tbs_end:
        raise CertificateError("its DER is not an X.509 certificate (validity past its end)")
    return Certificate(
        der[issuer[0] : issuer[1]], der[subject[0] : subject[1]], not_before, not_after
    )


def _header(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the element at `at`."""
    tag, length = der[at], der[at + 1]
    at += 2
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 4:
            raise ValueError(f"unsupported length of {count} bytes")
        length = int.from_bytes(der[at : at + count], "big")
        at += count
    if at + length > len(der):
        raise ValueError("an element runs past the end")
    return tag, at, at + length


def _content(der: bytes, at: int, tag: int) -> tuple[int, int]:
    found, start, end = _header(der, at)
    if found != tag:
        raise ValueError(f"tag 0x{found:02x} where 0x{tag:02x} belongs")
    return start, end


def _element(der: bytes, at: int, tag: int) -> tuple[tuple[int, int], int]:
    """((start, end) of the whole element, header included; the offset after it)."""
    end = _content(der, at, tag)[1]
    return (at, end), end


def _time(der: bytes, at: int) -> tuple[float, int]:
    tag, start, end = _header(der, at)
    text = der[start:end].decode("ascii")
    if tag == 0x17:  # UTCTime, YYMMDDHHMMSSZ: 50-99 are 19xx (RFC 5280)
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != 0x18:  # GeneralizedTime, YYYYMMDDHHMMSSZ
        raise ValueError(f"tag 0x{tag:02x} where a time belongs")
    if len(text) != 15 or not text.endswith("Z"):
        raise ValueError(f"time {text!r} is not YYYYMMDDHHMMSSZ")
    fields = (text[0:4], text[4:6], text[6:8], text[8:10], text[10:12], text[12:14])
    year, month, day, hour, minute, second = (int(f) for f in fields)
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))), end
