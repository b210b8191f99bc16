"""Run a real Triton Inference Server on the CPU, from the `nvidia-pytriton` wheel.

The wheel ships `tritonserver` 2.51 with the Python backend. This module finds the binary, builds a
backend directory with the Python backend's library, utilities and the stub for this Python, starts
the server on free ports in explicit model-control mode, waits until it is live, and stops it.
Used by the tests, the benchmarks and the demo; the product talks to a Triton it is given.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from common.tritonrelease import PINNED
from sim.processes import http_ok, process_stats

STANDIN_BACKENDS = Path(__file__).resolve().parent / "tritonbackends"
KEEPER = Path(__file__).resolve().parent.parent / "common" / "keeper.py"
"""The node pod's Triton container runs the server under this keeper (`kept`)."""
KEEPER_RESTARTED = "; its other processes are ended; starting it again in "
"""What the keeper's line says each time it starts the server again after an exit."""
PARALLEL_LOADS = 8
"""The agent's `--parallel-loads` default (`agent.parallelLoads`): a node's Triton loads that
many at once for each of its GPUs (`--model-load-thread-count`, as the chart sets it)."""


def write_standin_release(backend: Path) -> None:
    """Give a stand-in backend the bounds of the node's Triton release (`release.json`): it
    refuses what that release's backend refuses, whatever version of the package it runs on."""
    facts = {
        "onnx_max_ir": PINNED.onnx_max_ir,
        "onnx_max_opset": PINNED.onnx_max_opset,
        "onnx_max_ml_opset": PINNED.onnx_max_ml_opset,
    }
    (backend / "release.json").write_text(json.dumps(facts))


class TritonUnavailableError(RuntimeError):
    """nvidia-pytriton (and so the tritonserver binary) is not installed."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the wheel put the binary, its libraries and the Python backend."""

    binary: Path
    libs: Path
    python_backend: Path
    stub: Path

    @classmethod
    def find(cls) -> TritonInstall:
        """Locate the install; raise TritonUnavailableError with what to install if absent."""
        try:
            import pytriton
        except ImportError as e:
            raise TritonUnavailableError(
                "nvidia-pytriton is not installed; run `make test` (or pip install "
                "'nvidia-pytriton==0.7.0') to get the tritonserver binary"
            ) from e
        package = Path(pytriton.__file__).resolve().parent
        site = package.parent
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        install = cls(
            binary=package / "tritonserver" / "bin" / "tritonserver",
            libs=site / "nvidia_pytriton.libs",
            python_backend=package / "tritonserver" / "backends" / "python",
            stub=package
            / "tritonserver"
            / "python_backend_stubs"
            / version
            / "triton_python_backend_stub",
        )
        for path in (install.binary, install.libs, install.python_backend, install.stub):
            if not path.exists():
                raise TritonUnavailableError(f"the nvidia-pytriton install lacks {path}")
        return install

    def make_backend_dir(self, root: Path) -> Path:
        """Assemble `root/python/` with the backend library, utilities and this Python's stub."""
        python_dir = root / "python"
        python_dir.mkdir(parents=True, exist_ok=True)
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            target = python_dir / name
            if not target.exists():
                shutil.copy2(self.python_backend / name, target)
        stub = python_dir / "triton_python_backend_stub"
        if not stub.exists():
            shutil.copy2(self.stub, stub)
            stub.chmod(0o755)
        return root


_PORTS = ("http_port", "grpc_port", "metrics_port")
PORT_TRIES = 3
"""Starts of a server whose own picked port another process took before Triton bound it."""


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stub_environment_problem(python: Path | None = None) -> str:
    """Why the Python backend's stub would answer nothing right ("" when it would): it takes
    its packages from the `python3` first on PATH (`TritonServer.start` puts this interpreter's
    there), and nvidia-pytriton 0.7's stub needs numpy<2 in it."""
    python = python or Path(sys.executable).parent / "python3"
    probe = "import numpy; print(numpy.__version__)"
    found = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    version = found.stdout.strip()
    if found.returncode != 0 or not version or int(version.split(".")[0]) >= 2:
        have = f"numpy {version}" if version else "no numpy"
        return (
            f"the Python backend's stub takes its packages from {python}, which has {have}: "
            f"nvidia-pytriton 0.7's stub needs numpy<2 there (with numpy 2 every answer fails); "
            f"run from a venv with numpy<2 (make venv), or bash tests/gpu/run_on_gpu.sh env"
        )
    return ""


@dataclass
class TritonServer:
    """One tritonserver process. Use as a context manager (which discards it at the end), or
    call start() and then stop() (graceful, as a node pod's termination) or discard()."""

    model_repository: Path
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    restricted: bool = False
    extra_args: list[str] = field(default_factory=list)
    log_path: Path | None = None
    startup_timeout: float = 60.0
    gpu_metrics: bool = False
    """Serve Triton's GPU metrics (`nv_gpu_memory_used_bytes`): on a machine's real GPUs."""
    kept: bool = False
    """Run the server under the node pod's keeper (`common/keeper.py`), as Triton's container
    does: it starts the server again at once when it dies. `process` is then the keeper's, and
    `exited` says the container would have exited (the keeper gave up)."""
    parallel_loads: int = PARALLEL_LOADS
    """Loads Triton runs at once (`--model-load-thread-count`): the node's agent's
    `--parallel-loads`."""
    onnx_standin: bool = False
    """Also run models of the `onnxruntime` backend, on the `onnxruntime` package through the
    Python backend (`sim/tritonbackends/onnxruntime`): the simulated cluster's nodes, so that
    ONNX models (deploy/example's, a user's own) are served as shipped."""
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _workdir: Path | None = field(default=None, init=False)
    shm_prefix: str = field(
        default_factory=lambda: f"tritonshare_{uuid.uuid4().hex[:16]}_", init=False
    )
    """The Python backend's shared-memory regions of this server are /dev/shm/<prefix>*: what
    `discard` removes once it has killed the server (the backend removes them itself only on a
    graceful stop)."""

    @property
    def http_url(self) -> str:
        """host:port of the HTTP endpoint (tritonclient's form)."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """host:port of the gRPC endpoint (tritonclient's form)."""
        return f"127.0.0.1:{self.grpc_port}"

    def command(self, install: TritonInstall, backend_dir: Path) -> list[str]:
        """The tritonserver command line."""
        args = [
            str(install.binary),
            f"--model-repository={self.model_repository}",
            "--model-control-mode=explicit",
            f"--backend-directory={backend_dir}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            f"--allow-gpu-metrics={str(self.gpu_metrics).lower()}",
            "--allow-cpu-metrics=false",
            "--exit-on-error=false",
            "--strict-readiness=true",
            "--log-verbose=0",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--model-load-thread-count={self.parallel_loads}",
        ]
        if self.restricted:
            header = "tritonshare-admin-key=local"  # Triton 2.51 wants <api>:<header>=<value>
            args += [
                f"--http-restricted-api=model-repository,shared-memory,trace,logging:{header}",
                f"--grpc-restricted-protocol=model-repository,shared-memory,trace,logging:{header}",
            ]
        args += self.extra_args
        if self.kept:
            return [sys.executable, "-B", str(KEEPER), "--", *args]
        return args

    def start(self) -> TritonServer:
        """Start the server and wait until /v2/health/live answers. A port this picks itself
        (one left 0) that another process takes between the pick and Triton's bind (tests run
        side by side) is picked again, at most `PORT_TRIES` times in all."""
        picked = [name for name in _PORTS if getattr(self, name) == 0]
        log_path = self.log_path
        for tries_left in range(PORT_TRIES - 1, -1, -1):
            try:
                return self._launch()
            except RuntimeError as e:
                if not (picked and tries_left and "already in use" in str(e)):
                    raise
                for name in picked:
                    setattr(self, name, 0)
                self.log_path = log_path
        raise AssertionError("unreachable: the last try returns or raises")

    def _launch(self) -> TritonServer:
        install = TritonInstall.find()
        self._workdir = Path(tempfile.mkdtemp(prefix="tritonshare-triton-"))
        backend_dir = install.make_backend_dir(self._workdir / "backends")
        if self.onnx_standin:
            shutil.copytree(STANDIN_BACKENDS / "onnxruntime", backend_dir / "onnxruntime")
            write_standin_release(backend_dir / "onnxruntime")
        for name in _PORTS:
            if getattr(self, name) == 0:
                # Each a port of its own: two picks a moment apart may get the same free port.
                taken = {self.http_port, self.grpc_port, self.metrics_port}
                port = free_port()
                while port in taken:
                    port = free_port()
                setattr(self, name, port)
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = ":".join(
            p for p in (str(install.libs), env.get("LD_LIBRARY_PATH", "")) if p
        )
        # The Python backend's stub embeds libpython and finds its environment (numpy) through
        # the `python3` first on PATH: put this interpreter's bin directory first.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        log_path = self.log_path or (self._workdir / "tritonserver.log")
        with log_path.open("wb") as log_file:
            self.process = subprocess.Popen(
                self.command(install, backend_dir),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.log_path = log_path
        threading.Thread(
            target=_end_with,
            args=(self.process.pid, self.kept),
            name="triton-reaper",
            daemon=True,
        ).start()
        try:
            self._wait_live()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_live(self) -> None:
        """Wait until Triton answers on its HTTP and its metrics port. Triton starts its metrics
        server after its HTTP one, and exits when the metrics port is taken: HTTP alone may
        answer live a moment before that exit."""
        deadline = time.monotonic() + self.startup_timeout
        urls = [
            f"http://{self.http_url}/v2/health/live",
            f"http://127.0.0.1:{self.metrics_port}/metrics",
        ]
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"tritonserver exited with code {self.process.returncode} while starting; "
                    f"its log:\n{self.log_tail()}"
                )
            while urls and http_ok(urls[0]):
                urls.pop(0)
            if not urls:
                return
            time.sleep(0.05)
        raise TimeoutError(
            f"tritonserver was not live after {self.startup_timeout:.0f} s; log:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log, for error messages."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its work directory."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)
        self.process = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def discard(self) -> None:
        """Kill the server and its backend stubs at once and remove what they leave behind (the
        work directory, the shared-memory regions): the end of a test or a simulation, where no
        one is owed a graceful shutdown. stop() takes a second or two more whenever a model is
        loaded (Triton checks once a second that its models have unloaded)."""
        self.kill()
        self.process = None
        for region in Path("/dev/shm").glob(f"{self.shm_prefix}*"):  # noqa: S108 (POSIX shm)
            with contextlib.suppress(OSError):
                region.unlink()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def kill(self) -> None:
        """Kill the server abruptly (as a crash would), keeping the ports for a restart; a kept
        server with its keeper (the container)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(15)
        if self.process is not None and self.kept:
            _kill_session(self.process.pid)

    def kept_exits(self) -> int:
        """The server's exits its keeper started it again after (`kept`), from the keeper's
        lines in the log since the last `start` (0 without a keeper)."""
        if not self.kept or self.log_path is None:
            return 0
        try:
            return self.log_path.read_text(errors="replace").count(KEEPER_RESTARTED)
        except OSError:
            return 0

    def exited(self) -> bool:
        """Whether the server process has exited on its own (a crash)."""
        return self.process is not None and self.process.poll() is not None

    def restart(self) -> TritonServer:
        """Start it again on the same ports after it exited, as the kubelet restarts a crashed
        container: what it left (shared memory, its work directory; its backend stubs are
        already gone, `_end_with`) goes first."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(15)
        workdir = self._workdir
        if workdir and self.log_path and self.log_path.is_relative_to(workdir):
            self.log_path = None  # the new one logs into its own work directory
        self.discard()
        return self.start()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.discard()


def _end_with(pid: int, session: bool = False) -> None:
    """Kill what is left of the server's process group the moment its main process exits, as a
    container runtime kills a container's other processes when its main one exits (containerd's
    shim does, for a pod sharing its process namespace too). Without it the backend stubs would
    outlive a crashed server for seconds (one stuck in its model's `initialize` until the
    restart): holding the connections and listening sockets they inherited, they hide the
    death from anyone watching Triton's port, and a request sent meanwhile hangs."""
    with contextlib.suppress(ChildProcessError):
        # WNOWAIT: the exit stays for Popen to collect, and the pid (the group's id) unreused.
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if session:  # a keeper's: the server runs in a group of its own in the keeper's session
        _kill_session(pid)


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (a container's processes, here)."""
    for process in process_stats():
        if process.session == sid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
