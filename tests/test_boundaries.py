"""Import boundaries import-linter cannot express (it does not take subpackages of external
packages): aiohttp's server side (`aiohttp.web`) has at most one importer per part. The agent,
the binder and the proxy serve their health endpoints through common/health.py and import it
nowhere."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The one module per part allowed to import aiohttp's server pieces.
WEB_IMPORTERS = {
    "common": "common/health.py",
    "webhook": "webhook/server.py",
}


def _imports_aiohttp_web(path: Path) -> bool:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
            a.name == "aiohttp.web" or a.name.startswith("aiohttp.web_") for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "aiohttp.web" or node.module.startswith("aiohttp.web_"):
                return True
            if node.module == "aiohttp" and any(a.name.startswith("web") for a in node.names):
                return True
    return False


def test_only_one_module_per_part_imports_the_aiohttp_server() -> None:
    offenders = []
    for part in ("agent", "binder", "loader", "proxy", "webhook", "common", "protos"):
        for path in sorted((ROOT / part).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if _imports_aiohttp_web(path) and WEB_IMPORTERS.get(part) != relative:
                offenders.append(relative)
    assert not offenders, (
        f"these modules import aiohttp's server pieces outside their part's one allowed module "
        f"{sorted(WEB_IMPORTERS.values())}: {offenders}"
    )


def test_the_checker_sees_an_aiohttp_web_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from aiohttp import web\n")
    assert _imports_aiohttp_web(sample)
    sample.write_text("import aiohttp\n")
    assert not _imports_aiohttp_web(sample)


def _layer_contracts() -> dict[str, list[str]]:
    """Each layers contract's container -> the names its layers list."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    named: dict[str, list[str]] = {}
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["type"] != "layers":
            continue
        for container in contract.get("containers", []):
            names = [
                name.strip()
                for layer in contract["layers"]
                for name in layer.replace("|", ":").split(":")
            ]
            named[container] = [n for n in names if n]
    return named


def test_every_module_of_the_binder_and_the_agent_sits_in_a_layer() -> None:
    """The binder and the agent are subpackages in layers: each module and subpackage is named in
    its part's layers contract, and each subpackage's modules in the subpackage's own contract,
    so that a new module cannot slip between layers unchecked."""
    named = _layer_contracts()
    missing = []
    for part in ("binder", "agent"):
        subpackages = sorted(d for d in (ROOT / part).iterdir() if (d / "__init__.py").exists())
        packages = [ROOT / part, *subpackages]
        for package in packages:
            container = package.relative_to(ROOT).as_posix().replace("/", ".")
            members = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
            if package == ROOT / part:
                members |= {p.name for p in packages[1:]}
            layered = set(named.get(container, []))
            missing += [f"{container}.{m}" for m in sorted(members - layered)]
    assert not missing, f"not in any layer of pyproject.toml's import contracts: {missing}"
