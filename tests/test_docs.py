"""The commands the README and docs/ give are commands the parts accept.

Every shell block of README.md and docs/*.md is read as a shell would split it; each command that
runs a part (`python -m agent|binder|loader|proxy|proxy.gateway|webhook`, `tritonshare`,
`kubectl tritonshare`) is parsed by that part's own settings, required flags included, so a
renamed flag or a newly required one fails here before a reader copies it. Other `python -m`
commands (the simulator, benchmarks) have each flag checked against their `--help`, and each
`helm ... --set KEY=...` against the chart's values.yaml. README's "Running one part" block, the
one that runs on the simulated cluster, is run as written.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.settings import parse_settings as agent_settings
from binder.cli import FLAGS as CLI_FLAGS
from binder.cli import build_parser as cli_parser
from binder.settings import parse_settings as binder_settings
from loader.settings import parse_settings as loader_settings
from proxy.gateway.settings import parse_settings as gateway_settings
from proxy.settings import parse_settings as proxy_settings
from sim.triton import free_port
from tests.conftest import require_executable
from webhook.settings import parse_settings as webhook_settings

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.S | re.M)
_SHELL_BLOCKS = {"sh", "bash", "shell", "console"}
_COMMAND_LINE = re.compile(r"^(\$ )?(\S*python\S* -m |(kubectl )?tritonshare )", re.M)
_OPERATORS = {"&&", "||", "|", ";", "&", "(", ")", ">", ">>", "<", "2>"}


@dataclass(frozen=True)
class Command:
    doc: str
    argv: tuple[str, ...]
    environ: Mapping[str, str]

    def __str__(self) -> str:
        return f"{self.doc}: {shlex.join(self.argv)}"


def _logical_lines(block: str) -> Iterator[str]:
    """Lines joined across `\\` and a trailing `|`, prompts (`$ `) stripped, heredoc bodies
    skipped; synopsis brackets (`[--flag X]`) unwrapped and `<placeholders>` dropped."""
    heredoc_end = ""
    pending = ""
    for raw in block.splitlines():
        if heredoc_end:
            heredoc_end = "" if raw.strip() == heredoc_end else heredoc_end
            continue
        line = raw.removeprefix("$ ")
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", line)
        if heredoc:
            heredoc_end = heredoc.group(1)
            line = line[: heredoc.start()]
        pending += line
        if pending.rstrip().endswith("\\"):
            pending = pending.rstrip()[:-1] + " "
            continue
        if pending.split("#")[0].rstrip().endswith("|"):
            pending += " "
            continue
        text = re.sub(r"<[^<>]*>", "", pending)
        yield re.sub(r"\[(-[^\[\]]*)\]", r"\1", text)
        pending = ""
    if pending:
        yield pending


def _commands(doc: Path) -> Iterator[Command]:
    name = str(doc.relative_to(ROOT))
    for match in _FENCE.finditer(doc.read_text()):
        if match.group(1) not in _SHELL_BLOCKS:
            continue
        body = match.group(2)
        if match.group(1) == "console":
            # A transcript: only the prompted lines are commands.
            body = "\n".join(line for line in body.splitlines() if line.startswith("$ "))
        for line in _logical_lines(body):
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            try:
                tokens = list(lexer)
            except ValueError:
                continue  # not shell (a figure, a table of output)
            words: list[str] = []
            for token in [*tokens, ";"]:
                if token not in _OPERATORS:
                    words.append(token)
                    continue
                environ: dict[str, str] = {}
                while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                    key, _, value = words.pop(0).partition("=")
                    environ[key] = value
                if words:
                    yield Command(name, tuple(words), environ)
                words = []


def _part(command: Command) -> tuple[str, list[str]] | None:
    """(`module`, its argv) for `python -m module ...`, `tritonshare ...` and
    `kubectl tritonshare ...`; None for any other command."""
    argv = list(command.argv)
    if argv[0] == "kubectl" and argv[1:2] == ["tritonshare"]:
        return "binder.cli", argv[2:]
    if argv[0] in {"tritonshare", "kubectl-tritonshare"}:
        return "binder.cli", argv[1:]
    if Path(argv[0]).name.startswith("python") and argv[1:2] == ["-m"] and len(argv) > 2:
        return argv[2], argv[3:]
    return None


def _cli(argv: Sequence[str], environ: Mapping[str, str]) -> Any:
    return CLI_FLAGS.resolve(vars(cli_parser().parse_args(list(argv))), environ)


# The parts whose settings say what is required: each parses the documented argv, with only the
# environment the command line itself sets.
PARSERS: dict[str, Callable[[Sequence[str], Mapping[str, str]], Any]] = {
    "agent": agent_settings,
    "binder": binder_settings,
    "loader": loader_settings,
    "proxy": proxy_settings,
    "proxy.gateway": gateway_settings,
    "webhook": webhook_settings,
    "binder.cli": _cli,
}


@cache
def _help(module: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, f"python -m {module} --help failed: {done.stderr[-2000:]}"
    return done.stdout


def _flags(argv: Sequence[str]) -> list[str]:
    return [a.partition("=")[0] for a in argv if re.fullmatch(r"--[a-z][-a-z0-9]*(=.*)?", a)]


def _check(command: Command) -> None:
    found = _part(command)
    if found is None:
        return
    module, argv = found
    if module == "sim.gpu.agent_node" and "--" in argv:
        # The simulated node runs the real agent with what follows `--` (nothing in a synopsis
        # that says "agent flags as above").
        split = argv.index("--")
        if argv[split + 1 :]:
            agent_settings(argv[split + 1 :], dict(command.environ))
        argv = argv[:split]
    parse = PARSERS.get(module)
    if parse is not None:
        parse(argv, dict(command.environ))
        return
    usage = _help(module)
    unknown = [f for f in _flags(argv) if not re.search(rf"{re.escape(f)}\b", usage)]
    assert not unknown, f"python -m {module} --help does not know {unknown}"


ALL = [c for doc in DOCS for c in _commands(doc)]


def test_every_block_with_a_command_is_labelled_as_shell() -> None:
    """An unlabelled block is not read above: a command in one would escape these checks."""
    unlabelled = [
        f"{doc.relative_to(ROOT)}: {match.group(2).splitlines()[0]}"
        for doc in DOCS
        for match in _FENCE.finditer(doc.read_text())
        if match.group(1) == "" and _COMMAND_LINE.search(match.group(2))
    ]
    assert not unlabelled, f"label these blocks ```sh (or ```console): {unlabelled}"


def test_the_docs_give_commands_of_every_part() -> None:
    """The reader above finds what it must, so the checks below cannot pass by finding nothing."""
    modules = {found[0] for c in ALL if (found := _part(c)) is not None}
    assert set(PARSERS) <= modules
    assert "sim.apiserver" in modules and "sim.gpu.agent_node" in modules


@pytest.mark.parametrize("command", [c for c in ALL if _part(c) is not None], ids=str)
def test_each_documented_command_is_accepted_by_its_part(command: Command) -> None:
    try:
        _check(command)
    except SystemExit as e:
        pytest.fail(f"{command} exits {e.code} (argparse refused it)")
    except Exception as e:  # each part raises its own settings error
        pytest.fail(f"{command} is refused: {e}")


def _has_key(values: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(values, dict) or part not in values:
            return False
        values = values[part]
    return True


def test_each_documented_helm_value_exists_in_the_chart() -> None:
    values = yaml.safe_load((ROOT / "charts" / "tritonshare" / "values.yaml").read_text())
    given = [
        (c, argv[i + 1].partition("=")[0])
        for c in ALL
        if c.argv[0] == "helm"
        for argv in [list(c.argv)]
        for i, a in enumerate(argv[:-1])
        if a in {"--set", "--set-string"}
    ]
    assert given, "the docs install with helm --set: the reader found none"
    missing = [f"{c.doc}: {key}" for c, key in given if not _has_key(values, key)]
    assert not missing, f"values the chart does not have: {missing}"


def _readme_block(heading: str) -> str:
    """The first shell block under README's `heading`."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1]
    match = _FENCE.search(section)
    assert match is not None and match.group(1) == "sh", f"README's {heading} has no sh block"
    return match.group(2)


@pytest.mark.slow
def test_readmes_running_one_part_runs_on_the_simulated_cluster(tmp_path: Path) -> None:
    """The block as a reader pastes it, after `make venv` (this interpreter's environment), with
    its /tmp paths in a temporary directory and its ports free ones: every command succeeds,
    `status` shows the node's two GPUs and a live agent, and `explain` says the example pod is
    not there yet."""
    require_executable("kubectl")
    require_executable("openssl")
    script = _readme_block("Running one part")
    first, _, rest = script.partition("\n")
    assert first.startswith("make venv && . .venv/bin/activate && ")
    script = first.removeprefix("make venv && . .venv/bin/activate && ") + "\n" + rest
    script = script.replace("/tmp/", f"{tmp_path}/")
    for port in ("6443", "9200", "8000"):
        script = script.replace(f":{port}", f":{free_port()}").replace(
            f"--port {port}", f"--port {free_port()}"
        )
    bin_dir = Path(sys.executable).parent
    environ = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    # The example pod is the reader's to make: its `explain` exits 1 saying so, checked below.
    explain = "explain default/my-model-pod"
    script = "set -e\n" + script.replace(explain, f"{explain} || true")
    process = subprocess.Popen(
        ["bash", "-c", script],
        cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=120)
    finally:
        # Whatever the block left behind if it failed before its own `kill`.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    assert process.returncode == 0, output
    rows = [line.split() for line in output.splitlines() if line.startswith("node-1 ")]
    assert [(r[1], r[2], r[4:6]) for r in rows] == [
        ("alive", "0", ["Tesla", "T4"]),
        ("alive", "1", ["Tesla", "T4"]),
    ], output
    assert "pod default/my-model-pod does not exist" in output
