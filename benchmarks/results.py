"""docs/results.md, the one page of figures, kept by the benchmarks that measure them.

Each benchmark owns one marked block of the page, `<!-- results:NAME -->` to
`<!-- /results:NAME -->`, and replaces only that block, with its figures, the command line that
printed them, the machine and the date. A block the page does not have yet is appended at its
end. Writing is behind `--write-results` (`add_flag`), so a run on a development box prints its
figures and leaves the docs alone unless asked.

This module does no measuring and knows no benchmark: it formats and rewrites text.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import platform
import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

PAGE = Path(__file__).resolve().parents[1] / "docs" / "results.md"
_NAME = re.compile(r"[a-z0-9_]+")


class ResultsError(ValueError):
    """A block name or a page the rewrite cannot use; the message says what to change."""


def add_flag(parser: argparse.ArgumentParser) -> None:
    """`--write-results [PAGE]`: after the run, replace this benchmark's block of PAGE
    (docs/results.md when no page is given)."""
    parser.add_argument(
        "--write-results",
        nargs="?",
        type=Path,
        const=PAGE,
        default=None,
        metavar="PAGE",
        help="replace this benchmark's marked block of docs/results.md (or PAGE) with the "
        "figures printed, the command, the machine and the date",
    )


def markers(name: str) -> tuple[str, str]:
    if not _NAME.fullmatch(name):
        raise ResultsError(
            f"results block name {name!r} must be lower-case letters, digits and underscores, "
            "e.g. proxy_latency"
        )
    return f"<!-- results:{name} -->", f"<!-- /results:{name} -->"


def machine() -> str:
    """The CPU model, cores and memory of this machine, read from /proc where it exists."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    memory = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f", {int(line.split()[1]) / 2**20:.0f} GiB"
                break
    return f"{model}, {os.cpu_count() or 1} cores{memory}, {platform.system()}"


def command_line(argv: Sequence[str] | None = None) -> str:
    """`python -m benchmarks.X ARGS` for the running benchmark, as a reader would type it to
    measure again (without `--write-results`, which changes what is written, not measured)."""
    given = list(sys.argv[1:] if argv is None else argv)
    args: list[str] = []
    skip_value = False
    for arg in given:
        if skip_value and not arg.startswith("-"):
            skip_value = False
            continue
        skip_value = arg == "--write-results"
        if not skip_value and not arg.startswith("--write-results="):
            args.append(arg)
    module = sys.modules["__main__"].__spec__
    program = f"-m {module.name}" if module is not None else shlex.quote(sys.argv[0])
    return f"python {program} {shlex.join(args)}".rstrip()


def block(name: str, figures: str, *, command: str, machine: str, date: datetime.date) -> str:
    """The marked block: what ran, where, when, then the figures as printed."""
    start, end = markers(name)
    body = figures.rstrip("\n").replace("```", "'''")
    return (
        f"{start}\n"
        f"Command: `{command}`; machine: {machine}; date: {date.isoformat()}.\n\n"
        f"```text\n{body}\n```\n"
        f"{end}"
    )


def replace_block(page: str, name: str, new_block: str) -> str:
    """`page` with block `name` replaced by `new_block` (appended when the page has none)."""
    start, end = markers(name)
    first = page.find(start)
    if first < 0:
        if end in page:
            raise ResultsError(f"the page has {end} without {start}: restore the opening marker")
        return page.rstrip("\n") + "\n\n" + new_block + "\n"
    if page.find(start, first + 1) >= 0:
        raise ResultsError(f"the page has {start} twice: keep one block per benchmark")
    last = page.find(end, first)
    if last < 0:
        raise ResultsError(f"the page has {start} without {end}: restore the closing marker")
    return page[:first] + new_block + page[last + len(end) :]


def record(
    name: str,
    figures: str,
    *,
    page: Path = PAGE,
    command: str | None = None,
    date: datetime.date | None = None,
    where: str | None = None,
) -> None:
    """Rewrite block `name` of `page` with `figures`; nothing else of the page changes."""
    new_block = block(
        name,
        figures,
        command=command_line() if command is None else command,
        machine=machine() if where is None else where,
        date=datetime.datetime.now(datetime.UTC).date() if date is None else date,
    )
    text = page.read_text() if page.exists() else "# Results\n"
    page.write_text(replace_block(text, name, new_block))


class _Tee(io.TextIOBase):
    def __init__(self, target: TextIO) -> None:
        self.target = target
        self.kept = io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.target.write(text)

    def flush(self) -> None:
        self.target.flush()


@contextlib.contextmanager
def captured() -> Iterator[io.StringIO]:
    """Standard output still printed, and kept: what the benchmark printed is its figures."""
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield tee.kept
