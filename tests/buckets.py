"""Real bucket servers for the storage tests: moto's S3 API server and the GCS emulator, each on
port 0 in a thread of the test process, with helpers to put a model folder or archive in them.

The S3 server checks credentials (moto's IAM authentication, on once the bucket is made): only
`S3.key_id`/`S3.secret` read, anything else is refused as AWS refuses it. The GCS emulator has no
authentication; its clients find it through STORAGE_EMULATOR_HOST. `hostile_s3` stands in for
an S3 server that lists and sends without end, which neither real server can be made to do.
"""

from __future__ import annotations

import http.server
import io
import json
import tarfile
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

import boto3
import moto.settings
from gcp_storage_emulator.server import create_server
from google.cloud import storage as gcs
from moto.server import ThreadedMotoServer

REGION = "us-east-1"


def model_files(folder: Path, prefix: str) -> Iterator[tuple[str, bytes]]:
    """(object name, bytes) of every file of `folder`, named under `prefix`."""
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            yield f"{prefix}/{path.relative_to(folder).as_posix()}", path.read_bytes()


def archive(folder: Path) -> bytes:
    """`folder`'s files as a .tar.gz with them at its root."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, body in model_files(folder, "."):
            info = tarfile.TarInfo(name[2:])
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return data.getvalue()


@dataclass
class S3:
    endpoint: str
    """host:port, as the s3-endpoint annotation takes it (plain HTTP: s3-usehttps "0")."""
    key_id: str
    secret: str
    client: Any

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def put(self, bucket: str, name: str, body: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=name, Body=body)

    def put_model(self, bucket: str, prefix: str, folder: Path) -> str:
        """`folder`'s files under s3://bucket/prefix/; the URI."""
        for name, body in model_files(folder, prefix):
            self.put(bucket, name, body)
        return f"s3://{bucket}/{prefix}"


@contextmanager
def s3_server(bucket: str = "models") -> Iterator[S3]:
    """moto's S3 API server with `bucket` and one IAM user that may read it."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    saved = moto.settings.INITIAL_NO_AUTH_ACTION_COUNT
    try:
        host, port = server.get_host_and_port()
        setup = {"aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        url = f"http://{host}:{port}"
        # moto keeps its state in this process, not in the server: a server started before in
        # this worker left its user and bucket behind.
        reset = urllib.request.Request(f"{url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(reset, timeout=10) as answer:
            answer.read()
        iam = boto3.client("iam", endpoint_url=url, region_name=REGION, **setup)
        iam.create_user(UserName="reader")
        policy = {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
        iam.put_user_policy(
            UserName="reader",
            PolicyName="read",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [policy]}),
        )
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        iam.close()
        client = boto3.client(
            "s3",
            endpoint_url=url,
            region_name=REGION,
            aws_access_key_id=key["AccessKeyId"],
            aws_secret_access_key=key["SecretAccessKey"],
        )
        client.create_bucket(Bucket=bucket)
        # From here on every request is authenticated, as AWS's are.
        moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
        yield S3(f"{host}:{port}", key["AccessKeyId"], key["SecretAccessKey"], client)
        client.close()
    finally:
        moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = saved
        server.stop()


@dataclass
class Gcs:
    host: str
    """STORAGE_EMULATOR_HOST's value."""
    client: Any

    def put(self, bucket: str, name: str, body: bytes) -> None:
        self.client.bucket(bucket).blob(name).upload_from_string(body)

    def put_model(self, bucket: str, prefix: str, folder: Path) -> str:
        """`folder`'s files under gs://bucket/prefix/; the URI."""
        for name, body in model_files(folder, prefix):
            self.put(bucket, name, body)
        return f"gs://{bucket}/{prefix}"


@contextmanager
def gcs_server(bucket: str = "models") -> Iterator[Gcs]:
    """The GCS emulator with `bucket`. The caller sets STORAGE_EMULATOR_HOST to `.host` for the
    clients under test (this one is given the endpoint)."""
    server = create_server("127.0.0.1", 0, in_memory=True, default_bucket=bucket)
    server.start()
    try:
        port = server._api._httpd.server_address[1]  # port 0: the one it bound
        host = f"http://127.0.0.1:{port}"
        client = gcs.Client(
            project="test",
            credentials=_anonymous(),
            client_options={"api_endpoint": host},
        )
        yield Gcs(host, client)
        client.close()
    finally:
        server.stop()


def _anonymous() -> Any:
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()  # type: ignore[no-untyped-call]


@dataclass
class HostileS3:
    """An S3 stand-in on loopback that answers as no real bucket does, speaking just enough of
    the S3 API (ListObjectsV2, GetObject) for boto3: its listing is one object `slow/model.tar.gz`
    (`listing` "one"), or pages without end of keys beside the folder that only share its
    prefix ("beside"), or empty pages that each promise another ("empty"), each page after
    `page_delay` seconds; an object's body (1 MiB) trickles a KiB every 20 ms. It checks no
    credential. `close` ends every answer, so that nothing it serves outlives the test."""

    endpoint: str
    """host:port, as the s3-endpoint annotation takes it (plain HTTP)."""
    listing: str = "one"
    page_delay: float = 0.0
    pages: int = 0
    """Listing pages answered so far."""
    reading: int = 0
    """Bodies being sent now."""
    peak: int = 0
    """The most bodies sent at once since `peak` was last set."""
    closed: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def page(self, prefix: str) -> bytes:
        with self.lock:
            self.pages += 1
            number = self.pages
        self.closed.wait(self.page_delay)
        if self.closed.is_set() or self.listing == "one":
            keys = [("slow/model.tar.gz", 1 << 20)] if not self.closed.is_set() else []
            more = False
        elif self.listing == "beside":
            keys = [(f"{prefix}_beside_{number}_{n}/f", 1) for n in range(1000)]
            more = True
        else:
            keys, more = [], True
        contents = "".join(
            f"<Contents><Key>{escape(key)}</Key><Size>{size}</Size>"
            f'<LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>"0"</ETag>'
            f"<StorageClass>STANDARD</StorageClass></Contents>"
            for key, size in keys
        )
        token = f"<NextContinuationToken>page-{number}</NextContinuationToken>" if more else ""
        return (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>models</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(keys)}</KeyCount>"
            f"<MaxKeys>1000</MaxKeys><IsTruncated>{'true' if more else 'false'}</IsTruncated>"
            f"{contents}{token}</ListBucketResult>"
        ).encode()

    def trickle(self, out: Any) -> None:
        with self.lock:
            self.reading += 1
            self.peak = max(self.peak, self.reading)
        try:
            for _ in range(1024):
                if self.closed.wait(0.02):
                    break
                out.write(b"\0" * 1024)
                out.flush()
        except OSError:
            pass  # the client gave up
        finally:
            with self.lock:
                self.reading -= 1


@contextmanager
def hostile_s3() -> Iterator[HostileS3]:
    """A HostileS3 on 127.0.0.1, port 0, in threads of the test process."""
    holder: list[HostileS3] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.close_connection = True  # no idle connection outlives the test
            bucket = holder[0]
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            if "list-type" in query:
                body = bucket.page(query.get("prefix", [""])[0])
                self.send_response(200)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(1 << 20))
            self.send_header("ETag", '"0"')
            self.send_header("Last-Modified", "Thu, 01 Jan 2026 00:00:00 GMT")
            self.send_header("Connection", "close")
            self.end_headers()
            bucket.trickle(self.wfile)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(HostileS3(f"127.0.0.1:{server.server_address[1]}"))
    serving = threading.Thread(target=server.serve_forever, name="hostile S3")
    serving.start()
    try:
        yield holder[0]
    finally:
        holder[0].closed.set()
        server.shutdown()
        server.server_close()  # joins the request threads, which `closed` ended
        serving.join()
