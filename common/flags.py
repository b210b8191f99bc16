"""How every part's command line describes a flag: what it sets, its default, its variable.

Each part parses its own settings (`<part>/settings.py`); they share this wording so that
`--help` reads the same everywhere and always says which environment variable sets a flag and
what applies when neither is given. Pure: it formats text.
"""

from __future__ import annotations

ENV_PREFIX = "TRITONSHARE_"


def env_name(flag: str) -> str:
    """The environment variable of a flag: `--gpu-mem-reserve` -> TRITONSHARE_GPU_MEM_RESERVE."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def described(help_text: str, default: object, variable: str) -> str:
    """`help_text (default D; env V)`, or `(env V)` for a flag without a default."""
    if default is None or default == "" or default is False:
        return f"{help_text} (env {variable})"
    return f"{help_text} (default {default}; env {variable})"
