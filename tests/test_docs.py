"""The commands the README and docs/ give are commands the parts accept.

Every shell block of README.md and docs/*.md is read as a shell would split it; each command that
runs a part (`python -m agent|binder|loader|proxy|proxy.gateway|webhook`, `tritonshare`,
`kubectl tritonshare`) is parsed by that part's own settings, required flags included, so a
renamed flag or a newly required one fails here before a reader copies it. Other `python -m`
commands (the simulator, benchmarks) have each flag checked against their `--help`, and each
`helm ... --set KEY=...` against the chart's values.yaml; the quickstart's `make sim-up` block
runs as written in tests/e2e/test_sim_up.py. Then the docs bar: their size, no internal issue
numbers, and every link and every section a manifest or comment names.
"""

from __future__ import annotations

import re
import shlex
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
from binder.cli.main import FLAGS as CLI_FLAGS
from binder.cli.main import build_parser as cli_parser
from binder.settings import parse_settings as binder_settings
from loader.settings import parse_settings as loader_settings
from proxy.gateway.settings import parse_settings as gateway_settings
from proxy.settings import parse_settings as proxy_settings
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
        return "binder.cli.main", argv[2:]
    if argv[0] in {"tritonshare", "kubectl-tritonshare"}:
        return "binder.cli.main", argv[1:]
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
    "binder.cli.main": _cli,
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


# The docs bar: what a reader is handed stays short enough to read, and says nothing of how the
# project is run. Raised from 150,000 when the KServe ModelMesh migration page and the backend
# support matrix joined, and from 165,000 when learned GPU memory, a Triton release per pool,
# ModelMesh's metric names and placeholders sized by GPU joined; a page that grows without a new
# capability is trimmed instead.
DOCS_BUDGET_BYTES = 170_000
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_SECTION_REFERENCE = re.compile(r"docs/([a-z]+\.md)(?:,? \"([^\"]+)\"|#([a-z0-9-]+))")
_ISSUE_NUMBER = re.compile(r"\bissues? #?\d+|\(#\d+\)|\bPR #?\d+", re.I)
SOURCE_FOLDERS = ("agent", "binder", "loader", "proxy", "webhook", "common", "sim", "benchmarks")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces as
    dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


@cache
def _anchors(path: Path) -> frozenset[str]:
    text = _FENCE.sub("", path.read_text())
    seen: dict[str, int] = {}
    anchors = set()
    for match in re.finditer(r"^#{1,6} +(.+?) *$", text, re.M):
        slug = _slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(anchors)


def test_readme_and_docs_stay_under_their_budget() -> None:
    sizes = {str(doc.relative_to(ROOT)): len(doc.read_bytes()) for doc in DOCS}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    assert total <= DOCS_BUDGET_BYTES, (
        f"README.md and docs/ are {total} bytes, over {DOCS_BUDGET_BYTES}: trim repetition "
        f"(largest: {largest})"
    )


def test_docs_and_sources_name_no_internal_issue_numbers() -> None:
    """A reader has no access to the project's issue tracker: say what and why instead."""
    files = [*DOCS, ROOT / "charts" / "tritonshare" / "README.md"]
    files += [p for folder in SOURCE_FOLDERS for p in (ROOT / folder).rglob("*.py")]
    files += [p for folder in ("deploy", "charts") for p in (ROOT / folder).rglob("*.yaml")]
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)!r}"
        for path in files
        if "_pb2" not in path.name
        for match in _ISSUE_NUMBER.finditer(path.read_text())
    ]
    assert not found, found


def test_every_link_between_the_docs_resolves() -> None:
    """Each relative link of README.md, docs/ and the chart's README names a file that exists
    and, with `#anchor`, a heading of that file."""
    broken = []
    for doc in [*DOCS, ROOT / "charts" / "tritonshare" / "README.md", ROOT / "CHANGELOG.md"]:
        for target in _LINK.findall(_FENCE.sub("", doc.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path).resolve() if path else doc
            if not resolved.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_every_docs_section_named_by_a_manifest_or_the_code_exists() -> None:
    """`docs/deploy.md, "The example"` or `docs/runbooks.md#anchor` in a manifest, the chart or
    a source comment names a heading that is there (a section moved leaves its readers lost)."""
    files = [p for folder in ("deploy", "charts") for p in (ROOT / folder).rglob("*.yaml")]
    files += [ROOT / "Dockerfile", *(ROOT / "charts" / "tritonshare").glob("*.md")]
    files += [p for folder in SOURCE_FOLDERS for p in (ROOT / folder).rglob("*.py")]
    missing = []
    for path in files:
        for name, heading, anchor in _SECTION_REFERENCE.findall(path.read_text()):
            doc = ROOT / "docs" / name
            heading = re.sub(r"\s*\n\s*#?\s*", " ", heading)  # a comment wrapped over lines
            wanted = anchor or _slug(heading)
            # A heading may be named by its start: "Worst-case memory" for "Worst-case memory,
            # as a formula of the flags".
            if not doc.exists() or not any(a.startswith(wanted) for a in _anchors(doc)):
                missing.append(f"{path.relative_to(ROOT)}: docs/{name} {heading or anchor!r}")
    assert not missing, missing


# ---- docs/results.md: no figure older than the code it measures --------------------------------

_PLACEMENT = ("binder/framework", "binder/cluster")
_SERVING = ("agent", "binder", "proxy", "loader", "webhook")
MEASURES: dict[str, tuple[str, ...]] = {
    "python -m benchmarks.density": ("benchmarks/density.py", "benchmarks/shapes.py", *_PLACEMENT),
    "python -m benchmarks.residency --no-live": (
        "benchmarks/residency.py",
        "benchmarks/shapes.py",
        *_PLACEMENT,
    ),
    "python -m benchmarks.residency": (
        "benchmarks/residency.py",
        "benchmarks/residency_live.py",
        *_SERVING,
    ),
    "python -m benchmarks.model_hosts": ("benchmarks/model_hosts.py", "binder"),
    "python -m benchmarks.proxy_latency": (
        "benchmarks/proxy_latency.py",
        "benchmarks/tcp_relay.py",
        "proxy",
    ),
    "python -m benchmarks.onnx_latency": ("benchmarks/onnx_latency.py", "proxy"),
    "python -m benchmarks.kserve_client": ("benchmarks/kserve_client.py", "proxy"),
    "python -m benchmarks.modelmesh_router": ("benchmarks/modelmesh_router.py", "proxy"),
    "python -m benchmarks.proxy_hotpath": (
        "benchmarks/proxy_hotpath.py",
        "benchmarks/proxy_latency.py",
        "proxy",
    ),
    "pytest tests/proxy/gateway/test_inflate_attacks.py": (
        "tests/proxy/gateway/test_inflate_attacks.py",
        "proxy",
    ),
    "python -m benchmarks.noisy_neighbour": ("benchmarks/noisy_neighbour.py", "proxy"),
    "python -m benchmarks.namespace_share": ("benchmarks/namespace_share.py", "proxy"),
    "pytest tests/e2e/test_node_pod_replacement.py": (
        "tests/e2e/test_node_pod_replacement.py",
        *_SERVING,
    ),
    "python -m benchmarks.crash_quarantine": ("benchmarks/crash_quarantine.py", "agent"),
    "python -m benchmarks.autoscale --cost": ("benchmarks/autoscale.py", "binder/autoscaler"),
    "python -m benchmarks.autoscale": ("benchmarks/autoscale.py", *_SERVING),
    "python -m benchmarks.host_first_answer": ("benchmarks/host_first_answer.py", *_SERVING),
    "python -m benchmarks.churn": ("benchmarks/churn.py", "benchmarks/churnrule.py", *_SERVING),
    "python -m benchmarks.scale_from_zero": (
        "benchmarks/scale_from_zero.py",
        "benchmarks/loadfloor.py",
        *_SERVING,
    ),
    "python -m benchmarks.binder_e2e": ("benchmarks/binder_e2e.py", "binder"),
    "python -m benchmarks.replica_spread": ("benchmarks/replica_spread.py", *_SERVING),
    "pytest tests/e2e/test_agent_down.py": ("tests/e2e/test_agent_down.py", "agent", "binder"),
    "python -m benchmarks.agent_kube": ("benchmarks/agent_kube.py", "agent/kube", "common/kubeapi"),
    "python -m benchmarks.agent_install": ("benchmarks/agent_install.py", "agent"),
    "python -m tests.loader.bench_restart": ("tests/loader/bench_restart.py", "loader"),
    "pytest tests/webhook/test_webhook_floods.py": (
        "tests/webhook/test_webhook_floods.py",
        "webhook",
    ),
    "python -m benchmarks.sim_apiserver": ("benchmarks/sim_apiserver.py", "sim/apiserver"),
    "python -m benchmarks.held_bytes": ("benchmarks/held_bytes.py", "proxy"),
    "bash tests/gpu/run_on_gpu.sh": ("tests/gpu", "agent/gpus"),
    "python -m sim.demo --real-gpu": ("sim/demo", "agent"),
    "make demo": ("sim/demo", "Makefile", *_SERVING),
}
"""A results.md row's command (the start of the first one in its command cell, or a block's;
the longest that matches wins) -> the paths whose last change its figure must not be older than: the
benchmark itself and the parts of the product it measures."""
STALE = "stale"
"""The word a row's date cell carries when its figure is older than the code it measures."""
_DATE = re.compile(r"(\d{4}-\d\d-)(\d\d)((?:/\d\d)*)")


@dataclass(frozen=True)
class ResultRow:
    title: str
    command: str
    date: str
    """The last day it was measured on (`2026-11-26/27`: 2026-11-27)."""
    stale: bool


def result_rows(page: str) -> list[ResultRow]:
    """The rows of results.md's "Current figures" table."""
    table = page.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if len(cells) != 4 or cells[0] in ("benchmark", "---"):
            continue
        commands = re.findall(r"`([^`]+)`", cells[2])
        date = _DATE.search(cells[3])
        assert commands and date, f"results.md row {cells[0]!r}: no command or no date"
        day = date.group(3).rsplit("/", 1)[1] if date.group(3) else date.group(2)
        rows.append(ResultRow(cells[0], commands[0], date.group(1) + day, STALE in cells[3]))
    return rows


_BLOCK = re.compile(
    r"^<!-- results:([a-z0-9_]+) -->\nCommand: `([^`]+)`; machine: [^;]+; date: ([^\n]+)$", re.M
)


def result_blocks(page: str) -> list[ResultRow]:
    """The blocks the benchmarks write (`benchmarks.results`), each read as a row."""
    rows = []
    for name, command, when in _BLOCK.findall(page):
        date = _DATE.search(when)
        assert date, f"results.md block {name}: no date"
        rows.append(ResultRow(name, command, date.group(0), STALE in when))
    return rows


def measured_paths(command: str) -> tuple[str, ...]:
    """What a row's command measures (`MEASURES`), by the longest key it starts with."""
    keys = [key for key in MEASURES if command == key or command.startswith(key + " ")]
    assert keys, f"results.md command {command!r}: add it to MEASURES with the paths it measures"
    return MEASURES[max(keys, key=len)]


def _last_change(paths: Sequence[str]) -> str:
    done = subprocess.run(
        ["git", "log", "-1", "--format=%cs", "--", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _history_or_skip() -> None:
    try:
        shallow = subprocess.run(
            ["git", "rev-parse", "--is-shallow-repository"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the rows' dates need the code's history")
    if shallow != "false":
        pytest.skip(
            "a shallow clone: the last change to a row's code is unknown "
            "(`git fetch --unshallow`, or a full clone, runs this check)"
        )


def test_every_results_row_names_what_it_measures() -> None:
    page = (ROOT / "docs" / "results.md").read_text()
    rows = result_rows(page)
    assert len(rows) >= 20 and result_blocks(page)
    missing = [
        f"{key}: {path}"
        for key, paths in MEASURES.items()
        for path in paths
        if not (ROOT / path).exists()
    ]
    assert not missing, f"MEASURES names paths that are gone: {missing}"
    for row in [*rows, *result_blocks(page)]:
        measured_paths(row.command)


def test_the_stale_check_reads_dates_markers_and_the_longest_command() -> None:
    page = (
        "## Current figures\n\n| benchmark | figure | command | date |\n| --- | --- | --- | --- |\n"
        "| a | 1 | `python -m benchmarks.residency --no-live --as pods` | 2026-11-26/27 |\n"
        "| b | 2 | `python -m benchmarks.churn --minutes 3` | 2026-11-22 (stale) |\n"
        "\n## Next\n| x | y | `python -m benchmarks.churn` | 2026-01-01 |\n"
    )
    rows = result_rows(page)
    assert [(r.date, r.stale) for r in rows] == [("2026-11-27", False), ("2026-11-22", True)]
    assert measured_paths(rows[0].command) == MEASURES["python -m benchmarks.residency --no-live"]
    with pytest.raises(AssertionError, match="add it to MEASURES"):
        measured_paths("python -m benchmarks.nothing_such")
    block = (
        "<!-- results:held_bytes -->\nCommand: `python -m benchmarks.held_bytes`; machine: x, "
        "2 cores; date: 2026-11-25 (stale).\n"
    )
    assert result_blocks(block) == [
        ResultRow("held_bytes", "python -m benchmarks.held_bytes", "2026-11-25", True)
    ]


def test_no_results_row_is_older_than_the_code_it_measures_unless_marked_stale() -> None:
    """A figure measured before the last change to what it measures may no longer hold: rerun
    it (and write the new date) or mark its date cell `stale`, so a reader knows."""
    _history_or_skip()
    page = (ROOT / "docs" / "results.md").read_text()
    rows = [*result_rows(page), *result_blocks(page)]
    older = []
    for row in rows:
        changed = _last_change(measured_paths(row.command))
        if changed and row.date < changed and not row.stale:
            older.append(f"{row.title[:60]!r} ({row.date}; its code changed {changed})")
    assert not older, (
        "results.md rows older than the code they measure: rerun them or add "
        f"'{STALE}' to their date (a row's date cell, a block's date): {older}"
    )
