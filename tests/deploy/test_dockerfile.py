"""The Dockerfile builds one slim, non-root image with the four entry points.

No Docker engine runs here, so these read the Dockerfile and .dockerignore as a build would and
check what the image would contain; the build itself is documented in docs/deploy.md.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from common.version import VERSION
from tests.deploy.rendering import REPO

PARTS = ("agent", "binder", "loader", "proxy", "webhook")
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|make|build-essential|apt-get|apk|cc)\b")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def stages() -> list[Stage]:
    text = (REPO / "Dockerfile").read_text()
    logical = re.sub(r"\\\n", " ", text)
    args: dict[str, str] = {}
    result: list[Stage] = []
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "ARG" and not result:
            key, _, value = rest.partition("=")
            args[key] = value
        elif op == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append(Stage(base, name))
        else:
            result[-1].instructions.append((op, rest))
    return result


def test_the_image_is_multi_stage_on_a_pinned_slim_python() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2
    for stage in all_stages:
        assert re.fullmatch(r"python:3\.11[.\d]*-slim-\w+", stage.base), stage.base


def test_the_final_stage_is_non_root_and_has_no_build_tools() -> None:
    final = stages()[-1]
    users = [rest for op, rest in final.instructions if op == "USER"]
    assert users, "the final stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be numeric and not root (runAsNonRoot)"
    for op, rest in final.instructions:
        assert op != "RUN" or not BUILD_TOOLS.search(rest), f"build tools in final stage: {rest}"
    copies = [rest for op, rest in final.instructions if op == "COPY"]
    assert copies and all(c.startswith("--from=") for c in copies), (
        "the final stage copies only the built environment from the build stage"
    )


def test_the_build_stage_compiles_the_native_proxy_into_the_installed_package() -> None:
    """`python -m proxy.native` (docs/proxy.md, Performance) runs where the compiler is, and its
    extensions land in the venv the final stage copies, checked there by importing them."""
    build = stages()[0]
    runs = " ".join(rest for op, rest in build.instructions if op == "RUN")
    assert BUILD_TOOLS.search(runs), "the build stage installs no C compiler"
    assert "-m proxy.native" in runs, "the build stage does not compile the native proxy"
    assert re.search(r"-P -c 'import proxy\.app.*endswith\(\"\.so\"\)", runs), (
        "the build stage does not check that the installed proxy imports compiled"
    )


def test_the_manifests_run_as_the_image_user() -> None:
    final = stages()[-1]
    uid = int([rest for op, rest in final.instructions if op == "USER"][-1].split(":")[0])
    for manifest in (REPO / "deploy").rglob("*.yaml"):
        text = manifest.read_text()
        if "image: tritonshare" in text:
            assert f"runAsUser: {uid}" in text, f"{manifest} does not run as uid {uid}"


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path.split("/")[0], pattern):
            ignored = not negate
    return ignored


def test_the_build_context_holds_every_package_the_image_installs() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    build = stages()[0]
    copied = [shlex.split(rest)[:-1] for op, rest in build.instructions if op == "COPY"]
    sources = {src for srcs in copied for src in srcs}
    for package in ("common", "protos", *PARTS):
        assert package in sources, f"the build stage does not copy {package}/"
        assert not _ignored(f"{package}/__init__.py", patterns), f".dockerignore drops {package}/"
    assert not _ignored("pyproject.toml", patterns)
    assert _ignored(".venv/bin/python", patterns), ".dockerignore must keep .venv out"
    for tooling in ("tests", "sim", "benchmarks", "charts"):
        assert _ignored(f"{tooling}/__init__.py", patterns), f".dockerignore lets {tooling}/ in"
        assert tooling not in sources, f"the build stage copies {tooling}/"


def _can_build_here() -> bool:
    """setuptools new enough for pyproject.toml's build requirement, and wheel, are installed."""
    try:
        setuptools_version = importlib.metadata.version("setuptools")
        importlib.metadata.version("wheel")
    except importlib.metadata.PackageNotFoundError:
        return False
    return int(setuptools_version.split(".")[0]) >= 68


def _context(patterns: list[str], target: Path) -> None:
    """Copy what `docker build .` would send, per .dockerignore, into `target`."""
    for entry in REPO.iterdir():
        if not _ignored(entry.name if entry.is_file() else f"{entry.name}/x", patterns):
            if entry.is_dir():
                shutil.copytree(
                    entry, target / entry.name, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                shutil.copy2(entry, target / entry.name)


@pytest.mark.slow
def test_the_build_stage_installs_a_package_whose_entry_points_run(tmp_path: Path) -> None:
    """What the build stage's `pip install .` produces, from the context .dockerignore lets
    through: every part runs from the installed package, not from this source tree."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    context, installed = tmp_path / "context", tmp_path / "installed"
    context.mkdir()
    _context(patterns, context)
    for left_out in ("tests", ".venv", "sim", "benchmarks"):
        assert not (context / left_out).exists(), f"{left_out}/ is in the build context"
    # Build with this environment's setuptools when it can (fast, offline), else as the
    # Dockerfile does, in an isolated build environment fetched from the index.
    isolation = ["--no-build-isolation"] if _can_build_here() else []
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation,
         "--target", str(installed), str(context)],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(installed)}
    for part in PARTS:
        where = subprocess.run(
            [sys.executable, "-c", f"import {part}; print({part}.__file__)"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert Path(where.stdout.strip()).is_relative_to(installed)
        run = subprocess.run(
            [sys.executable, "-m", part, "--help"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert run.returncode == 0, f"python -m {part} --help failed in the image:\n{run.stderr}"
    assert (installed / "protos" / "agent.proto").exists(), "the proto ships with the package"
    # (This environment may still find sim/ through its own development install; what matters
    # is that the image's install holds none of it.)
    assert not (installed / "sim").exists(), "the image ships sim/"
    found = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; s = u.find_spec('sim'); "
         "print(s.origin if s else '')"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    origin = found.stdout.strip()
    assert not origin or not Path(origin).is_relative_to(installed), "the image ships sim/"
    cli = subprocess.run(
        [str(installed / "bin" / "tritonshare"), "--help"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert cli.returncode == 0 and "status" in cli.stdout, f"the tritonshare CLI:\n{cli.stderr}"
    plugin = subprocess.run(
        [str(installed / "bin" / "kubectl-tritonshare"), "--help"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert plugin.returncode == 0, f"the kubectl plugin:\n{plugin.stderr}"
    assert plugin.stdout.startswith("usage: kubectl tritonshare")
    # The installed package carries common/version.py's version, in its metadata and its CLI.
    assert (installed / f"tritonshare-{VERSION}.dist-info").is_dir()
    shown = subprocess.run(
        [str(installed / "bin" / "tritonshare"), "--version"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.stdout == f"tritonshare {VERSION}\n", shown.stderr


def test_each_entry_point_is_a_runnable_module() -> None:
    missing = [part for part in PARTS if importlib.util.find_spec(f"{part}.__main__") is None]
    if missing:
        pytest.skip(f"parts without a __main__ yet (the image cannot run them): {missing}")
    for part in PARTS:
        spec = importlib.util.find_spec(f"{part}.__main__")
        assert spec is not None and spec.origin is not None
        assert Path(spec.origin).is_relative_to(REPO / part)
