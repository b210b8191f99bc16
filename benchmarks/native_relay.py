"""The bare TCP relay (`benchmarks/tcp_relay.py`) compiled with mypyc, as `python -m
proxy.native` compiles the proxy: the floor `proxy_latency --native` sets the compiled proxy and
gateway against, so a compiled hop is compared with a compiled relay, not an interpreted one.

`build()` copies the relay into `OUT` and compiles it there (rebuilt only when the relay, mypy or
Python changed: a hash kept in `STAMP`); `command()` is the command line that runs the compiled
relay (`python -m` cannot run an extension module, so it imports and calls its `main`).

What it must not do: write anywhere but `OUT`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import sys
from pathlib import Path

from proxy.native import STAMP, compile_in

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "native-relay"
SOURCE = Path("benchmarks") / "tcp_relay.py"
_RUN = "import sys; from benchmarks.tcp_relay import main; sys.exit(main())"


def fingerprint(root: Path = ROOT) -> str:
    """What a build depends on: the relay's source, mypy's and Python's versions."""
    digest = hashlib.sha256()
    digest.update(repr((sys.version, importlib.metadata.version("mypy"))).encode())
    digest.update((root / SOURCE).read_bytes())
    return digest.hexdigest()


def build(out: Path = OUT, root: Path = ROOT) -> bool:
    """Compile the relay into `out` unless it already holds a build of the same source; True
    when it built. Raises CalledProcessError (with mypyc's output) when the build fails."""
    stamp = fingerprint(root)
    if (out / STAMP).is_file() and (out / STAMP).read_text().strip() == stamp:
        return False
    work = out.with_name(out.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    (work / SOURCE.parent).mkdir(parents=True)
    (work / SOURCE.parent / "__init__.py").write_text("")
    shutil.copy2(root / SOURCE, work / SOURCE)
    compile_in(work, out, [str(SOURCE)], "[mypy]\nignore_missing_imports = True\n", stamp)
    return True


def command() -> list[str]:
    """The command that runs the compiled relay, in the build's folder (its arguments follow)."""
    return [sys.executable, "-c", _RUN]


def compiled(out: Path = OUT) -> bool:
    """Whether the relay `out` holds is an extension module, not the copied source."""
    return any(out.joinpath(SOURCE.parent).glob("tcp_relay.*.so"))
