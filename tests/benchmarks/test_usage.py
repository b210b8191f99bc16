"""Every benchmark says how to run it and what it measures: `--help` names the command one types
(`python -m benchmarks.NAME`, not `NAME.py`) and a description of its own, whose flags exist."""

from __future__ import annotations

import importlib
import re

import pytest

BENCHMARKS = (
    "agent_install",
    "binder_e2e",
    "binder_placement",
    "churn",
    "density",
    "held_bytes",
    "kserve_client",
    "model_hosts",
    "noisy_neighbour",
    "onnx_latency",
    "proxy_framing",
    "proxy_hotpath",
    "proxy_latency",
    "replica_spread",
    "residency",
    "scale_from_zero",
    "sim_apiserver",
)


def _help(name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    module = importlib.import_module(f"benchmarks.{name}")
    monkeypatch.setattr("sys.argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_every_benchmark_has_its_own_usage_and_description(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    descriptions = {}
    for name in BENCHMARKS:
        text = _help(name, monkeypatch, capsys)
        assert text.startswith(f"usage: python -m benchmarks.{name} "), text.splitlines()[0]
        usage, _, rest = text.partition("\n\n")
        description = " ".join(rest.partition("\n\n")[0].split())
        # argparse wraps at hyphens: `--poc-` at a line's end, `decisions` on the next.
        description = re.sub(r"(--[a-z0-9-]*-) ", r"\1", description)
        assert description.endswith("."), f"{name}: the description is cut short: {description}"
        assert re.match(r"(Measures|Counts)\b", description), description
        options = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", usage))
        named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", description))
        assert named and named <= options, f"{name} describes flags it lacks: {named - options}"
        descriptions[name] = description
    assert len(set(descriptions.values())) == len(BENCHMARKS)
