"""No part accepts an abbreviated flag: with argparse's default, `--gpu` silently meant
`--gpu-mem-reserve` and `--placement` `--placement-key-dir`, so a typo changed a setting."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from agent.settings import SettingsError as AgentSettingsError
from agent.settings import parse_settings as agent_settings
from binder.cli.main import build_parser as cli_parser
from binder.errors import SettingsError as BinderSettingsError
from binder.settings import parse_settings as binder_settings
from common.settings import env_name
from loader.errors import SettingsError as LoaderSettingsError
from loader.settings import parse_settings as loader_settings
from proxy.settings import SettingsError as ProxySettingsError
from proxy.settings import parse_settings as proxy_settings
from webhook.settings import parse_settings as webhook_settings

AGENT = ["--node-name", "n", "--model-repository", "/m", "--placement-key-dir", "/k"]


def _agent(argv: list[str]) -> Any:
    return agent_settings(argv, {})


def _binder(argv: list[str]) -> Any:
    return binder_settings(argv, {"TRITONSHARE_PLACEMENT_KEY_DIR": "/k"})


def _loader(argv: list[str]) -> Any:
    return loader_settings(["--model-id", "m", "--agent-address", "10.0.0.5:8100", *argv], {})


def _proxy(argv: list[str]) -> Any:
    required = ["--triton-http-url", "127.0.0.1:8000", "--triton-grpc-url", "127.0.0.1:8001"]
    return proxy_settings(["--model-id", "m", *required, *argv], {})


def _cli(argv: list[str]) -> Any:
    return cli_parser().parse_args(["status", *argv])


@pytest.mark.parametrize(
    ("parse", "whole", "abbreviated", "refused"),
    [
        (_agent, [*AGENT, "--install-deadline-seconds", "3"], [*AGENT, "--install-dead", "3"],
         (AgentSettingsError, SystemExit)),
        (_binder, ["--gpu-mem-reserve", "1Gi"], ["--gpu", "1Gi"], (BinderSettingsError,)),
        (_loader, ["--timeout", "30"], ["--time", "30"], (LoaderSettingsError, SystemExit)),
        (_proxy, ["--drain-seconds", "1"], ["--drain", "1"], (ProxySettingsError, SystemExit)),
        (_cli, ["--namespace", "x"], ["--names", "x"], (SystemExit,)),
    ],
    ids=["agent", "binder", "loader", "proxy", "cli"],
)  # fmt: skip
def test_an_abbreviated_flag_is_refused_and_the_whole_one_works(
    parse: Callable[[list[str]], Any],
    whole: list[str],
    abbreviated: list[str],
    refused: tuple[type[BaseException], ...],
) -> None:
    parse(whole)
    with pytest.raises(refused):
        parse(abbreviated)


@pytest.mark.parametrize(
    ("part", "parse"),
    [
        ("agent", lambda: agent_settings(["--help"], {})),
        ("binder", lambda: binder_settings(["--help"], {})),
        ("loader", lambda: loader_settings(["--help"], {})),
        ("proxy", lambda: proxy_settings(["--help"], {})),
        ("webhook", lambda: webhook_settings(["--help"], {})),
    ],
)
def test_help_names_every_flags_variable_and_default(
    part: str, parse: Callable[[], Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse()
    text = " ".join(capsys.readouterr().out.split())
    # --help and --version come with every part and set nothing.
    named = set(re.findall(r"(?<![\w-])--([a-z][a-z0-9-]+)", text))
    flags = sorted(named - {"help", "version", "kubeconfig"})
    assert flags, f"{part} --help lists no flags"
    missing = [f for f in flags if env_name(f) not in text]
    assert not missing, f"{part} --help does not name the variables of {missing}"
    assert "(default " in text
