"""One version everywhere: common/version.py is the source; pyproject.toml reads it, and the chart,
the image's label, the manifests' image tags and every part's `--version` say the same."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from agent.settings import parse_settings as agent_settings
from binder.cli.main import build_parser as cli_parser
from binder.settings import parse_settings as binder_settings
from common.version import VERSION
from loader.settings import parse_settings as loader_settings
from proxy.gateway.settings import parse_settings as gateway_settings
from proxy.settings import parse_settings as proxy_settings
from tests.deploy.rendering import CHART, DEPLOY, KUSTOMIZATIONS, REPO
from webhook.settings import parse_settings as webhook_settings

CHANGELOG = REPO / "CHANGELOG.md"


def test_the_version_is_semantic_and_pyproject_reads_it_from_common_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", VERSION), VERSION
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"], "pyproject.toml must not carry a second version"
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "common.version.VERSION"}


def test_the_chart_and_the_image_label_carry_the_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION), (
        "charts/tritonshare/Chart.yaml's version and appVersion must be common/version.py's "
        f"{VERSION}"
    )
    dockerfile = (REPO / "Dockerfile").read_text()
    labels = re.findall(r'org\.opencontainers\.image\.version="([^"]*)"', dockerfile)
    assert labels == [VERSION], f"the Dockerfile's version label is {labels}, not {VERSION}"


def test_the_manifests_deploy_the_image_of_this_version() -> None:
    tags = {}
    for name in KUSTOMIZATIONS:
        document = yaml.safe_load((DEPLOY / name / "kustomization.yaml").read_text())
        for image in document.get("images") or []:
            if image.get("newName", "").endswith("/tritonshare"):
                tags[name] = image.get("newTag")
    assert tags and set(tags.values()) == {VERSION}, tags
    # The webhook writes this image into the model pods it completes.
    assert webhook_settings([], {}).image.endswith(f"/tritonshare:{VERSION}")


def _cli(argv: list[str]) -> Any:
    return cli_parser().parse_args(argv)


@pytest.mark.parametrize(
    ("prog", "parse"),
    [
        ("python -m agent", lambda argv: agent_settings(argv, {})),
        ("python -m binder", lambda argv: binder_settings(argv, {})),
        ("python -m loader", lambda argv: loader_settings(argv, {})),
        ("python -m proxy", lambda argv: proxy_settings(argv, {})),
        ("python -m proxy.gateway", lambda argv: gateway_settings(argv, {})),
        ("python -m webhook", lambda argv: webhook_settings(argv, {})),
        ("tritonshare", _cli),
    ],
)
def test_every_part_prints_the_version_without_its_required_flags(
    prog: str, parse: Callable[[list[str]], Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(["--version"])
    assert exited.value.code == 0
    expected = f"{prog} {VERSION}" if prog == "tritonshare" else f"{prog} (tritonshare) {VERSION}"
    assert capsys.readouterr().out == expected + "\n"


def test_the_changelog_has_a_release_entry_for_the_version() -> None:
    """Tag-ready: `## [Unreleased]` on top, then this version's entry with its date, so
    `git tag vVERSION` names a release the changelog describes."""
    headings = re.findall(
        r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", CHANGELOG.read_text(), re.M
    )
    assert headings[0] == ("Unreleased", ""), headings
    assert headings[1][0] == VERSION and headings[1][1], (
        f"CHANGELOG.md's first release is {headings[1]}, not common/version.py's {VERSION}"
    )
