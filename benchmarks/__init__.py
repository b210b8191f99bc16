"""Scripts that print figures side by side with a baseline (`python -m benchmarks.NAME`)."""

from __future__ import annotations

import argparse


def command_line(name: str, description: str) -> argparse.ArgumentParser:
    """The command line of `python -m benchmarks.NAME`: its own usage line (argparse would say
    `NAME.py`, which no one can run) and a description of what it measures and how its main
    flags change that."""
    return argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=description)
