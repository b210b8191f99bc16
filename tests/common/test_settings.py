"""Every part's settings come from one kind of declaration, so they read and fail alike: variables
follow one convention, --help names each flag's variable and default, a default shown is the
default applied, and a bad value is refused as `--flag: 'value' why; what to write`."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

import agent.settings
import binder.cli.main
import binder.errors
import binder.settings
import loader.errors
import loader.settings
import proxy.gateway.settings
import proxy.settings
import sim.apiserver.settings
import sim.gpu.agent_node
import webhook.settings
from common.settings import (
    BadValueError,
    Declaration,
    Setting,
    declared,
    env_name,
    names,
    node_cpus,
    path,
    quantity,
    seconds,
    setting,
    text,
    unflagged,
    whole,
    whole_or_cpus,
)

OUTSIDE_VARIABLES = {"KUBECONFIG", "NODE_NAME"}
"""Variables other tools own (kubectl, the Downward API in our manifests), read as they are."""
ANY_TEXT = {text, path, names}
"""Kinds that accept whatever is written."""


@dataclass(frozen=True)
class Part:
    name: str
    declaration: Declaration
    settings_class: type | None
    error: type[Exception]
    required: Mapping[str, str]


PARTS = [
    Part(
        "agent",
        agent.settings.DECLARATION,
        agent.settings.Settings,
        agent.settings.SettingsError,
        {"node-name": "n", "model-repository": "/m", "placement-key-dir": "/k"},
    ),
    Part(
        "binder",
        binder.settings.DECLARATION,
        binder.settings.Settings,
        binder.errors.SettingsError,
        {"placement-key-dir": "/k"},
    ),
    Part("cli", binder.cli.main.FLAGS, None, binder.errors.SettingsError, {}),
    Part(
        "loader",
        loader.settings.DECLARATION,
        loader.settings.Settings,
        loader.errors.SettingsError,
        {"model-id": "m", "agent-address": "10.0.0.5:8100"},
    ),
    Part(
        "proxy",
        proxy.settings.DECLARATION,
        proxy.settings.Settings,
        proxy.settings.SettingsError,
        {"model-id": "m", "triton-http-url": "t:8000", "triton-grpc-url": "t:8001"},
    ),
    Part(
        "gateway",
        proxy.gateway.settings.DECLARATION,
        proxy.gateway.settings.GatewaySettings,
        proxy.settings.SettingsError,
        {"caller-table": "/run/callers.json"},
    ),
    Part(
        "webhook",
        webhook.settings.DECLARATION,
        webhook.settings.Settings,
        webhook.settings.SettingsError,
        {},
    ),
    Part(
        "sim.apiserver",
        sim.apiserver.settings.DECLARATION,
        sim.apiserver.settings.ApiServerSettings,
        sim.apiserver.settings.SettingsError,
        {},
    ),
    Part(
        "sim.gpu.agent_node",
        sim.gpu.agent_node.OWN_FLAGS,
        None,
        sim.gpu.agent_node.SettingsError,
        {"gpus": "1xT4"},
    ),
]
SETTINGS = [
    pytest.param(part, setting, id=f"{part.name} --{setting.flag}")
    for part in PARTS
    for setting in part.declaration.settings
]


def _argv(part: Part, **override: str) -> list[str]:
    given = {**part.required, **override}
    return [word for flag, value in given.items() for word in (f"--{flag}", value)]


@pytest.mark.parametrize(("part", "setting"), SETTINGS)
def test_the_variable_follows_the_convention(part: Part, setting: Setting) -> None:
    if setting.variable is not None and setting.variable not in OUTSIDE_VARIABLES:
        assert setting.variable == env_name(setting.flag)
    assert set(setting.also_env) <= OUTSIDE_VARIABLES


@pytest.mark.parametrize("part", PARTS, ids=[p.name for p in PARTS])
def test_help_names_every_variable_and_default(
    part: Part, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # argparse would break long words at their hyphens
    with pytest.raises(SystemExit):
        part.declaration.parser().parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for s in part.declaration.settings:
        if s.variable is not None:
            assert s.variable in help_text, f"{part.name} --help does not name {s.variable}"
        if s.default not in (None, ""):
            assert f"default {s.default}" in help_text, f"{part.name} --{s.flag} default"


@pytest.mark.parametrize(("part", "setting"), SETTINGS)
def test_a_bad_value_names_the_flag_and_the_value(part: Part, setting: Setting) -> None:
    if setting.switch or setting.kind in ANY_TEXT:
        return
    refusals = []
    for bad in ("12q", "@@ bad @@", "host:99999"):
        try:
            part.declaration.values(_argv(part, **{setting.flag: bad}), {})
        except part.error as e:
            refusals.append((bad, str(e)))
    assert refusals, f"{part.name} --{setting.flag} accepts anything"
    for bad, message in refusals:
        assert message.startswith(f"--{setting.flag}: "), message
        assert bad in message


def test_a_bad_variable_is_named_with_its_flag() -> None:
    part = PARTS[0]
    with pytest.raises(part.error) as e:
        part.declaration.values(_argv(part), {"TRITONSHARE_MAX_MODEL_BYTES": "12q"})
    assert str(e.value) == (
        "TRITONSHARE_MAX_MODEL_BYTES (for --max-model-bytes): '12q' is not a Kubernetes "
        "quantity; write e.g. 512Mi, 2Gi, 500M or 1e9"
    )


class RefusedError(ValueError):
    pass


@declared
class Demo:
    """Settings for these tests."""

    count: int = setting("count", "how many", whole(minimum=1), required="how many to make")
    size_bytes: int = setting("size", "bytes", quantity(), default="1Ki")
    wait: float | None = setting("wait", "seconds", seconds(positive=True), default=None)
    fast: bool = setting("fast", "go fast", switch=True, default=False)
    kubeconfig: str | None = setting("kubeconfig", "kubeconfig", env="KUBECONFIG", default=None)
    namespace: str = setting("namespace", "namespace", env=None, aliases=("-n",), default="")
    audit_size: int = unflagged(default=7)


DEMO = Declaration.of(Demo, "demo", "A declaration for these tests.", error=RefusedError)


def test_a_field_is_declared_once_with_its_flag() -> None:
    assert [(s.flag, s.name) for s in DEMO.settings] == [
        ("count", "count"),
        ("size", "size_bytes"),
        ("wait", "wait"),
        ("fast", "fast"),
        ("kubeconfig", "kubeconfig"),
        ("namespace", "namespace"),
    ]
    # The default --help shows is the default the field gets, read by the setting's kind.
    (size,) = (s for s in DEMO.settings if s.flag == "size")
    assert size.describe() == "bytes (default 1Ki; env TRITONSHARE_SIZE)"
    assert Demo(count=1).size_bytes == 1024
    assert Demo(**DEMO.values(["--count", "1"], {})) == Demo(count=1)
    assert Demo(**DEMO.values(["--count", "1", "--size", "2Ki"], {})).size_bytes == 2048
    with pytest.raises(dataclasses.FrozenInstanceError):
        Demo(count=1).count = 2  # type: ignore[misc]


def test_a_setting_cannot_be_declared_twice_or_half() -> None:
    @declared
    class Twice:
        a: int = setting("a", "a", whole(), default="1")
        b: int = setting("a", "b", whole(), default="2")

    with pytest.raises(ValueError, match=r"^x: a flag is declared twice"):
        Declaration.of(Twice, "x", "", error=RefusedError)

    @declared
    class Half:
        a: int = setting("a", "a", whole(), default="1")
        b: int = 2

    with pytest.raises(TypeError, match=r"^x: Half\.b is declared half: it has no flag"):
        Declaration.of(Half, "x", "", error=RefusedError)
    with pytest.raises(ValueError, match=r"^--a: its default '1q' is refused: is not a whole"):
        setting("a", "a", whole(), default="1q")
    with pytest.raises(ValueError, match=r"^--a is declared required and with a default"):
        setting("a", "a", whole(), default="1", required="why")
    with pytest.raises(TypeError, match=r"^x: Half is not a @declared class"):
        Declaration.of(type("Half", (), {}), "x", "", error=RefusedError)


def test_a_flag_wins_over_its_variable_which_wins_over_the_default() -> None:
    assert DEMO.values(["--count", "2"], {}) == {"size_bytes": 1024, "count": 2}
    env = {"TRITONSHARE_SIZE": "2Ki", "TRITONSHARE_COUNT": "3", "TRITONSHARE_FAST": "yes"}
    assert DEMO.values([], env) == {"size_bytes": 2048, "count": 3, "fast": True}
    assert DEMO.values(["--size", "4Ki", "--fast"], {**env, "TRITONSHARE_FAST": "no"}) == {
        "size_bytes": 4096,
        "count": 3,
        "fast": True,
    }
    assert DEMO.values(["-n", "x"], {"KUBECONFIG": "/k", "TRITONSHARE_COUNT": "1"}) == {
        "size_bytes": 1024,
        "count": 1,
        "kubeconfig": "/k",
        "namespace": "x",
    }


def test_an_empty_value_counts_as_not_given() -> None:
    assert "wait" not in DEMO.values(["--count", "1", "--wait", ""], {"TRITONSHARE_WAIT": ""})


def test_refusals_say_what_to_fix() -> None:
    with pytest.raises(
        RefusedError, match=r"^--count is required \(how many to make\): set the flag "
    ):
        DEMO.values([], {})
    with pytest.raises(
        RefusedError, match=r"^--size: '12q' is not a Kubernetes quantity; write e.g."
    ):
        DEMO.values(["--count", "1", "--size", "12q"], {})
    with pytest.raises(RefusedError, match=r"^unrecognized arguments: --siz 1; run `demo --help`"):
        DEMO.values(["--count", "1", "--siz", "1"], {})
    with pytest.raises(RefusedError, match=r"^--wait: 'inf' must be more than 0 seconds"):
        DEMO.values(["--count", "1", "--wait", "inf"], {})


def test_one_setting_is_read_leniently() -> None:
    assert DEMO.raw(["--bogus", "--size", "3"], {}, "size") == "3"
    assert DEMO.raw(["--count", "x"], {"TRITONSHARE_SIZE": "5"}, "size") == "5"
    assert DEMO.raw([], {}, "wait") is None


def test_a_flag_declared_twice_is_a_mistake() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        Declaration("x", "", [Setting("a", "a"), Setting("a", "b")], error=RefusedError)


def test_a_kind_refuses_with_a_reason_that_follows_the_value() -> None:
    with pytest.raises(BadValueError, match=r"^is negative; use 0 or more$"):
        whole()("-1")
    assert re.fullmatch(r"is less than 1Ki", _reason(quantity(minimum=1024), "1000"))


def _reason(kind: Any, value: str) -> str:
    try:
        kind(value)
    except BadValueError as e:
        return str(e)
    raise AssertionError(f"{value!r} was accepted")


def test_a_count_that_may_be_auto_reads_the_nodes_cpus_or_a_whole_number() -> None:
    """`--max-in-flight-node` and `--max-model-threads`: auto is the CPUs this process may run
    on; anything else is a whole number of 0 or more, refused saying auto was possible too."""
    assert whole_or_cpus("auto") == whole_or_cpus(" AUTO ") == node_cpus() >= 1
    assert whole_or_cpus("0") == 0 and whole_or_cpus("12") == 12
    with pytest.raises(BadValueError, match=r"is not a whole number \(or auto"):
        whole_or_cpus("many")
    with pytest.raises(BadValueError, match=r"is negative.*\(or auto"):
        whole_or_cpus("-1")
    required = ["--caller-table", "/run/callers.json"]
    gateway = proxy.gateway.settings.parse_settings([*required, "--max-in-flight-node", "3"], {})
    assert gateway.max_in_flight_node == 3
    assert proxy.gateway.settings.parse_settings(required, {}).max_in_flight_node == node_cpus()
