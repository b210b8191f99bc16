"""Flags and TRITONSHARE_* variables become one checked Settings object, or a clear exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from loader.errors import ExitCode, SettingsError
from loader.settings import (
    DEFAULT_MODEL_DIR,
    DEFAULT_TERMINATION_LOG,
    DEFAULT_TOKEN_FILE,
    normalize_address,
    parse_settings,
    termination_log_from,
)

REQUIRED = ["--model-id", "add_one", "--agent-address", "10.0.0.5:9100"]


def test_defaults_fit_a_model_pod() -> None:
    settings = parse_settings(REQUIRED, {})
    assert settings.model_id == "add_one"
    assert settings.agent_address == "10.0.0.5:9100"
    assert settings.model_dir == DEFAULT_MODEL_DIR == Path("/mnt/models")
    assert settings.token_file == DEFAULT_TOKEN_FILE
    assert settings.termination_log == DEFAULT_TERMINATION_LOG == Path("/dev/termination-log")
    assert settings.max_model_bytes == 32 * 1024**3
    assert settings.chunk_bytes == 1024**2
    assert settings.log_format == "text"


def test_environment_variables_fill_in_and_flags_win() -> None:
    environ = {
        "TRITONSHARE_MODEL_ID": "from_env",
        "TRITONSHARE_AGENT_ADDRESS": "10.1.2.3",
        "TRITONSHARE_MODEL_DIR": "/models/x",
        "TRITONSHARE_TIMEOUT": "42",
        "TRITONSHARE_MAX_MODEL_BYTES": "1500Mi",
        "TRITONSHARE_LOG_FORMAT": "json",
    }
    settings = parse_settings([], environ)
    assert settings.model_id == "from_env"
    assert settings.agent_address == "10.1.2.3:8100"
    assert settings.model_dir == Path("/models/x")
    assert settings.timeout_seconds == 42
    assert settings.max_model_bytes == 1500 * 1024**2
    assert settings.log_format == "json"
    assert parse_settings(["--model-id", "from_flag"], environ).model_id == "from_flag"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--agent-address", "a:1"],
            "--model-id is required .*: set the flag or TRITONSHARE_MODEL_ID",
        ),
        (["--model-id", "m"], "--agent-address is required"),
        ([*REQUIRED[:1], ".hidden", *REQUIRED[2:]], "starts with a dot"),
        ([*REQUIRED[:1], "a/b", *REQUIRED[2:]], r"outside \[A-Za-z0-9_.-\]"),
        ([*REQUIRED, "--timeout", "soon"], "--timeout: 'soon' is not a number of seconds"),
        ([*REQUIRED, "--timeout", "-1"], "must be more than 0 seconds"),
        ([*REQUIRED, "--timeout", "nan"], "must be more than 0 seconds"),
        ([*REQUIRED, "--max-model-bytes", "lots"], "not a Kubernetes quantity"),
        ([*REQUIRED, "--max-model-bytes", "0"], "--max-model-bytes: '0' must be more than 0 bytes"),
        ([*REQUIRED, "--chunk-bytes", "8Mi"], "below gRPC's 4Mi message limit"),
        ([*REQUIRED, "--log-format", "xml"], "neither 'text' nor 'json'"),
        ([*REQUIRED, "--backoff-initial", "9", "--backoff-max", "1"], "at least --backoff-initial"),
        ([*REQUIRED, "--no-such-flag"], r"unrecognized arguments.*--help"),
    ],
)
def test_bad_settings_say_what_to_fix(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as e:
        parse_settings(argv, {})
    assert e.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("10.0.0.5", "10.0.0.5:8100"),
        ("10.0.0.5:9200", "10.0.0.5:9200"),
        ("node-1.example", "node-1.example:8100"),
        ("fd00::5", "[fd00::5]:8100"),
        ("[fd00::5]", "[fd00::5]:8100"),
        ("[fd00::5]:9300", "[fd00::5]:9300"),
        (" 127.0.0.1:1 ", "127.0.0.1:1"),
    ],
)
def test_agent_addresses_get_the_default_port(given: str, expected: str) -> None:
    assert normalize_address(given) == expected


@pytest.mark.parametrize("given", [":9100", "host:0", "host:99999", "host:http", "fd00:::zz"])
def test_malformed_agent_addresses_are_refused(given: str) -> None:
    with pytest.raises(SettingsError, match="agent address"):
        normalize_address(given)


def test_the_termination_log_is_found_even_when_other_settings_are_bad() -> None:
    assert termination_log_from(["--timeout", "x", "--termination-log", "/t/x"], {}) == Path("/t/x")
    env = {"TRITONSHARE_TERMINATION_LOG": "/t/env"}
    assert termination_log_from(["--bogus"], env) == Path("/t/env")
    assert termination_log_from([], {}) == DEFAULT_TERMINATION_LOG


def test_a_host_s_loader_takes_its_models_from_the_agent() -> None:
    host = ["--host", "--agent-address", "10.0.0.5", "--models-file", "/ready/models.json"]
    settings = parse_settings([*host, "--model-root", "/models"], {})
    assert settings.host and settings.model_id == ""
    assert settings.models_file == Path("/ready/models.json")
    assert settings.model_root == Path("/models")
    assert (settings.host_poll_seconds, settings.drain_seconds, settings.host_parallel) == (
        0.25,
        30.0,
        8,
    )
    with pytest.raises(SettingsError, match="--model-root is required with --host"):
        parse_settings(host, {})
    with pytest.raises(SettingsError, match="with --host the models come from the agent"):
        parse_settings([*host, "--model-root", "/m", "--model-id", "m"], {})
    with pytest.raises(SettingsError, match="--host-parallel: '0'"):
        parse_settings([*host, "--model-root", "/m", "--host-parallel", "0"], {})
