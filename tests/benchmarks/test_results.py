"""benchmarks/results.py: a benchmark rewrites only its own block of docs/results.md, appends a
block the page lacks, refuses a page whose markers are broken, and writes only when asked."""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import results

DAY = datetime.date(2026, 11, 25)

PAGE = """# Results

Intro a reader keeps.

## Proxy

<!-- results:proxy_latency -->
old proxy figures
<!-- /results:proxy_latency -->

Text between blocks stays.

<!-- results:density -->
old density figures
<!-- /results:density -->

## Tail
"""


def _write(tmp_path: Path, text: str = PAGE) -> Path:
    page = tmp_path / "results.md"
    page.write_text(text)
    return page


def test_a_benchmark_replaces_only_its_own_block(tmp_path: Path) -> None:
    page = _write(tmp_path)
    results.record(
        "density", "GPUs 834\nmemory 3.3x\n", page=page, command="python -m benchmarks.density",
        date=DAY, where="test box",
    )  # fmt: skip
    text = page.read_text()
    before, _, after = PAGE.partition("<!-- results:density -->")
    assert text.startswith(before)
    assert text.endswith(after.partition("<!-- /results:density -->")[2])
    assert "old proxy figures" in text and "old density figures" not in text
    assert (
        "<!-- results:density -->\n"
        "Command: `python -m benchmarks.density`; machine: test box; date: 2026-11-25.\n\n"
        "```text\nGPUs 834\nmemory 3.3x\n```\n"
        "<!-- /results:density -->"
    ) in text


def test_rewriting_twice_leaves_one_block(tmp_path: Path) -> None:
    page = _write(tmp_path)
    for figures in ("first\n", "second\n"):
        results.record("proxy_latency", figures, page=page, command="c", date=DAY, where="m")
    text = page.read_text()
    assert text.count("<!-- results:proxy_latency -->") == 1
    assert "second" in text and "first" not in text and "old proxy figures" not in text


def test_a_missing_block_is_appended(tmp_path: Path) -> None:
    page = _write(tmp_path)
    results.record("binder_e2e", "1,234 pods/s\n", page=page, command="c", date=DAY, where="m")
    text = page.read_text()
    assert text.startswith(PAGE.rstrip("\n"))
    assert text.endswith("1,234 pods/s\n```\n<!-- /results:binder_e2e -->\n")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("<!-- results:density -->\nno end\n", "without <!-- /results:density -->"),
        ("no start\n<!-- /results:density -->\n", "without <!-- results:density -->"),
        (
            "<!-- results:density -->\n<!-- /results:density -->\n" * 2,
            "<!-- results:density --> twice",
        ),
    ],
)
def test_broken_markers_are_refused_and_the_page_is_left_alone(
    tmp_path: Path, text: str, says: str
) -> None:
    page = _write(tmp_path, text)
    with pytest.raises(results.ResultsError, match=says):
        results.record("density", "x", page=page, command="c", date=DAY, where="m")
    assert page.read_text() == text


def test_a_name_that_is_not_a_marker_is_refused(tmp_path: Path) -> None:
    with pytest.raises(results.ResultsError, match="lower-case letters"):
        results.record("Density -->", "x", page=_write(tmp_path), command="c", where="m")


def test_figures_cannot_close_the_code_block(tmp_path: Path) -> None:
    page = _write(tmp_path)
    results.record("density", "a\n```\nb\n", page=page, command="c", date=DAY, where="m")
    text = page.read_text()
    assert "```text\na\n'''\nb\n```\n<!-- /results:density -->" in text


def test_the_flag_writes_nothing_unless_given() -> None:
    parser = argparse.ArgumentParser()
    results.add_flag(parser)
    assert parser.parse_args([]).write_results is None
    assert parser.parse_args(["--write-results"]).write_results == results.PAGE
    assert parser.parse_args(["--write-results", "x.md"]).write_results == Path("x.md")


def test_captured_output_is_printed_and_kept(capsys: pytest.CaptureFixture[str]) -> None:
    with results.captured() as printed:
        print("figure 1")
    assert printed.getvalue() == "figure 1\n"
    assert capsys.readouterr().out == "figure 1\n"


def test_the_command_line_leaves_the_writing_out() -> None:
    assert results.command_line(["--rounds", "3", "--write-results", "x.md", "--native"]).endswith(
        " --rounds 3 --native"
    )
    assert results.command_line(["--write-results", "--seed", "1"]).endswith(" --seed 1")
    assert "write-results" not in results.command_line(["--write-results=x.md", "--seed", "1"])


def test_the_machine_names_its_cores() -> None:
    assert "cores" in results.machine()


def test_density_writes_its_block_only_with_the_flag(tmp_path: Path) -> None:
    """The real benchmark, at smoke-test size: without the flag the page is untouched; with it,
    its block holds what it printed and the command that printed it."""
    page = _write(tmp_path)
    # At smoke-test size the goal (set for the full fleet) is not the point: --no-goal.
    small = ["--scale", "0.05", "--models", "40", "--lifetimes", "0.2", "--no-repack-check"]
    small.append("--no-goal")
    root = Path(__file__).resolve().parents[2]
    run = [sys.executable, "-m", "benchmarks.density", *small]
    done = subprocess.run(run, cwd=root, capture_output=True, text=True, timeout=300, check=True)
    assert page.read_text() == PAGE
    done = subprocess.run(
        [*run, "--write-results", str(page)],
        cwd=root, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    text = page.read_text()
    assert "old density figures" not in text and "old proxy figures" in text
    assert "whole-GPU serving" in text and "whole-GPU serving" in done.stdout
    assert "Command: `python -m benchmarks.density --scale 0.05" in text
    assert "--write-results" not in text
