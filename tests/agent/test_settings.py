"""The agent's settings: flags, TRITONSHARE_* variables, defaults, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.settings import SettingsError, parse_settings


def test_flags_then_environment_then_defaults() -> None:
    settings = parse_settings(
        ["--model-repository", "/models", "--cpu-only", "--resync-seconds", "5"],
        {
            "NODE_NAME": "n1",
            "TRITONSHARE_TRITON_ADMIN_HEADER": "tritonshare-admin-key:s3cret",
            "TRITONSHARE_LISTEN_GRPC": "127.0.0.1:0",
            "TRITONSHARE_ADVERTISE_GPU_MEM": "true",
            "KUBECONFIG": "/kc",
            "TRITONSHARE_PLACEMENT_KEY_DIR": "/keys",
            "TRITONSHARE_TENANT_CODE_NAMESPACES": "team-a, team-b",
        },
    )
    assert settings.placement_key_dir == Path("/keys")
    assert settings.tenant_code_namespaces == ("team-a", "team-b")
    # The framework backends whose graphs can read files are tenant code by default.
    assert settings.safe_backends == ("onnxruntime", "tensorrt")
    assert settings.max_model_bytes == 64 * 1024**3
    assert settings.node_name == "n1"
    assert settings.model_repository == Path("/models")
    assert settings.triton_admin_header == ("tritonshare-admin-key", "s3cret")
    assert settings.listen_grpc == "127.0.0.1:0"
    assert settings.cpu_only and settings.advertise_gpu_mem
    assert settings.kubeconfig == "/kc"
    assert settings.resync_seconds == 5.0
    assert settings.lease_duration_seconds == 15
    assert settings.lease_renew_seconds == 5.0
    assert settings.keys.gpu_mem_total == "tritonshare.io/gpu-mem-total"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model-repository", "/m"], "--node-name is required"),
        (["--node-name", "n"], "--model-repository is required"),
        (["--node-name", "n", "--model-repository", "/m", "--listen-grpc", "9100"], "host:port"),
        (["--node-name", "n", "--model-repository", "/m", "--key-prefix", "Bad Prefix"], "prefix"),
        (
            ["--node-name", "n", "--model-repository", "/m", "--lease-renew-seconds", "15"],
            "shorter than --lease-duration-seconds",
        ),
        (
            ["--node-name", "n", "--model-repository", "/m", "--triton-admin-header", "novalue"],
            "Name:value",
        ),
        (["--node-name", "n", "--model-repository", "/m", "--max-model-bytes", "lots"], "quantity"),
        (
            ["--node-name", "n", "--model-repository", "/m", "--install-idle-seconds", "0"],
            "more than 0",
        ),
    ],
)
def test_bad_settings_say_what_to_fix(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_settings(argv, {"TRITONSHARE_PLACEMENT_KEY_DIR": "/keys"})


def test_the_placement_keys_are_required() -> None:
    with pytest.raises(SettingsError, match="--placement-key-dir is required"):
        parse_settings(["--node-name", "n", "--model-repository", "/m"], {})
