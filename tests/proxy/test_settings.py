"""Settings from flags and TRITONSHARE_* variables, and clear errors for bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.__main__ import main
from proxy.settings import SettingsError, parse_settings

ONE_GIB = 1024**3

REQUIRED = ["--model-id", "add_one", "--triton-http-url", "t:8000", "--triton-grpc-url", "t:8001"]


def test_defaults() -> None:
    settings = parse_settings(REQUIRED, env={})
    assert settings.listen_http == ("0.0.0.0", 9000)
    assert settings.listen_grpc == ("0.0.0.0", 9001)
    assert settings.listen_metrics == ("0.0.0.0", 9002)
    assert settings.max_body_bytes == ONE_GIB
    assert settings.container_concurrency == 0 and settings.queue_limit == 0
    assert settings.agent_address == "" and settings.token_file is None
    assert settings.grpc_mode == "relay"
    assert settings.idle_timeout_seconds == 300.0


def test_environment_and_flags() -> None:
    env = {"TRITONSHARE_CONTAINER_CONCURRENCY": "4", "TRITONSHARE_MAX_BODY": "2Gi"}
    settings = parse_settings([*REQUIRED, "--listen-http", "127.0.0.1:0"], env=env)
    assert settings.container_concurrency == 4
    assert settings.queue_limit == 40  # 10x the limit by default
    assert settings.max_body_bytes == 2 * ONE_GIB
    assert settings.listen_http == ("127.0.0.1", 0)
    settings = parse_settings([*REQUIRED, "--container-concurrency", "2", "--queue-size", "0"], {})
    assert settings.queue_limit == 0
    assert parse_settings(REQUIRED, {"TRITONSHARE_GRPC_MODE": "grpcio"}).grpc_mode == "grpcio"
    idle = parse_settings(REQUIRED, {"TRITONSHARE_IDLE_TIMEOUT": "0"}).idle_timeout_seconds
    assert idle == 0.0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model-id", ".hidden"], "starts with a dot"),
        (["--max-body", "lots"], "not a Kubernetes quantity"),
        (["--container-concurrency", "-1"], "negative"),
        (["--queue-timeout", "soon"], "not a number of seconds"),
        (["--idle-timeout", "-5"], "--idle-timeout: '-5' is negative"),
        (["--listen-http", "9000"], "not host:port"),
        (["--log-format", "xml"], "neither 'text' nor 'json'"),
        (["--grpc-mode", "h2"], "neither 'grpcio' nor 'relay'"),
        (["--agent-address", "a:1"], "--token-file is not"),
        (["--triton-name", "a/b"], "--triton-name"),
        (["--triton-name", "p", "--grpc-mode", "grpcio"], "--grpc-mode relay only"),
    ],
)
def test_bad_values_say_what_is_wrong(extra: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_settings([*REQUIRED, *extra], env={})


def test_missing_required_settings() -> None:
    with pytest.raises(SettingsError, match="--triton-grpc-url"):
        parse_settings(["--model-id", "m", "--triton-http-url", "t:1"], env={})
    with pytest.raises(SettingsError, match="has a scheme"):
        parse_settings(
            ["--model-id", "m", "--triton-http-url", "http://t:1", "--triton-grpc-url", "t:2"], {}
        )


def test_main_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--model-id", "m"]) == 2
    assert "--triton-http-url is required" in capsys.readouterr().err


def test_the_private_name_in_triton() -> None:
    settings = parse_settings(REQUIRED, env={})
    assert settings.triton_name == "" and settings.name_in_triton == "add_one"
    env = {"TRITONSHARE_TRITON_NAME": "ns-a.add_one.5f0c"}
    settings = parse_settings(REQUIRED, env=env)
    assert settings.name_in_triton == "ns-a.add_one.5f0c"
    assert parse_settings([*REQUIRED, "--triton-name", "p"], env).triton_name == "p"
