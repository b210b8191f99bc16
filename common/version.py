"""The one version of tritonshare: every part, the container image and the Helm chart.

`pyproject.toml` reads `VERSION` from here (setuptools' `attr:`, read without importing), and
tests/deploy/test_version.py checks that the chart's Chart.yaml and the Dockerfile's image label
carry the same. Every part prints it with `--version`, logs it at start and exports it as
`tritonshare_build_info{version=...}` (common.health). Kept as a literal here rather than read
from the installed package's metadata, so a source tree (a worktree, `PYTHONPATH=.`, an editable
install made from another checkout) reports its own version, never a stale or missing one.
"""

from __future__ import annotations

VERSION = "0.1.0"


def version_line(prog: str) -> str:
    """What `PROG --version` prints, as GNU tools word it: `python -m agent (tritonshare) 0.1.0`;
    the CLI, already named tritonshare, says `tritonshare 0.1.0`."""
    if "tritonshare" in prog:
        return f"{prog} {VERSION}"
    return f"{prog} (tritonshare) {VERSION}"
