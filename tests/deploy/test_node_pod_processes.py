"""The node pod shares one process namespace so the agent knows Triton's processes: Triton's
container writes its PID where the agent reads it (`--triton-pid-file`), and every container runs
as its own user, so none can signal, trace or read another's files. Checked on the kustomize base
and on the chart, and the Triton container's command is run as the kubelet would run it (its
`$(VAR)` expansion, a stand-in `tritonserver` on PATH): the PID written is the one that serves,
and the NVML relay it starts from what the init container installed answers the agent's socket
from inside Triton's process tree."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.errors import NvmlUnavailableError
from agent.gpus.nvml import GpuReader
from agent.gpus.processes import TritonProcesses
from agent.gpus.relay import install
from agent.gpus.relayclient import RelayedNvml
from sim.node.podspec import expand, rewrite_paths
from sim.processes import wait_until
from tests.deploy.rendering import render
from tests.deploy.test_chart import render_chart
from tests.deploy.test_manifests import kubectl as kubectl


def _node_pods(kubectl: str) -> dict[str, Mapping[str, Any]]:
    """The node DaemonSets' pod specs of the base and of the chart (default values)."""
    found: dict[str, Mapping[str, Any]] = {}
    for where, objects in (("base", render(kubectl, "base")), ("chart", render_chart())):
        for obj in objects:
            if obj["kind"] == "DaemonSet" and "agent" in _containers(obj):
                found[f"{where}/{obj['metadata']['name']}"] = obj["spec"]["template"]["spec"]
    assert found
    return found


def _containers(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    spec = obj["spec"]["template"]["spec"] if "template" in obj.get("spec", {}) else obj
    return {c["name"]: c for c in spec["containers"]}


def _mount(container: Mapping[str, Any], volume: str) -> Mapping[str, Any]:
    mounts: list[Mapping[str, Any]] = list(container.get("volumeMounts", []))
    [mount] = [m for m in mounts if m["name"] == volume]
    return mount


def _pid_file(agent: Mapping[str, Any]) -> str:
    [flag] = [a for a in agent["args"] if a.startswith("--triton-pid-file=")]
    return str(flag).partition("=")[2]


def test_the_agent_reads_the_pid_tritons_container_writes(kubectl: str) -> None:
    for where, spec in _node_pods(kubectl).items():
        assert spec.get("shareProcessNamespace") is True, where
        containers = _containers(spec)
        triton, agent = containers["triton"], containers["agent"]
        pid_file = _pid_file(agent)
        written = _mount(triton, "triton-pid")
        read = _mount(agent, "triton-pid")
        assert read.get("readOnly") is True, where
        assert Path(pid_file).parent == Path(read["mountPath"]) == Path(written["mountPath"])
        assert written["mountPath"] in " ".join(triton["command"]), where
        [volume] = [v for v in spec["volumes"] if v["name"] == "triton-pid"]
        assert "emptyDir" in volume, where
        # No two containers share a user: a shared process namespace lets a process signal or
        # trace the others of its user.
        users = {
            name: (c.get("securityContext") or {}).get("runAsUser")
            or spec["securityContext"]["runAsUser"]
            for name, c in containers.items()
        }
        assert len(set(users.values())) == len(users), (where, users)


def test_the_agent_asks_nvml_through_the_relay_tritons_container_runs(kubectl: str) -> None:
    for where, spec in _node_pods(kubectl).items():
        containers = _containers(spec)
        triton, agent = containers["triton"], containers["agent"]
        [install] = [c for c in spec["initContainers"] if c["name"] == "nvml-relay"]
        env = {e["name"]: e.get("value") for e in agent.get("env", [])}
        assert env["TRITONSHARE_GPU_SOURCE"] == "triton", where
        assert not [name for name in env if name.startswith("NVIDIA_")], where
        socket = Path(str(env["TRITONSHARE_NVML_RELAY_SOCKET"]))
        directory = _mount(install, "nvml-relay")["mountPath"]
        assert install["command"][-2:] == ["--install", directory], where
        assert _mount(triton, "nvml-relay")["mountPath"] == directory, where
        assert _mount(agent, "nvml-relay") == {
            "name": "nvml-relay",
            "mountPath": directory,
            "readOnly": True,
        }, where
        assert socket.parent == Path(directory), where
        assert f"{directory}/nvmlrelay.py --socket {socket}" in triton["command"][2], where


def _relay_in(processes: TritonProcesses) -> int:
    """The PID of the NVML relay in Triton's tree (0: none yet)."""
    tree = processes.tree()
    for pid in tree.pids if tree is not None else ():
        with contextlib.suppress(OSError):
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            # Not the shell's loop, whose command line is the whole script.
            if any(w.endswith(b"/nvmlrelay.py") for w in words):
                return pid
    return 0


def _server_in(processes: TritonProcesses) -> int:
    """The PID of the stand-in server in Triton's tree (0: none now)."""
    tree = processes.tree()
    for pid in tree.pids if tree is not None else ():
        with contextlib.suppress(OSError):
            if b"time.sleep" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    return 0


def test_tritons_command_writes_the_pid_of_the_server_it_starts(
    kubectl: str, tmp_path: Path
) -> None:
    spec = next(iter(_node_pods(kubectl).values()))
    triton = _containers(spec)["triton"]
    directory = _mount(triton, "triton-pid")["mountPath"]
    local = tmp_path / "pid"
    local.mkdir()
    # What the init container installs (Triton's container runs it with its own python3). A
    # Unix socket's path is short: the relay's directory is one of its own under /tmp.
    relay_directory = _mount(triton, "nvml-relay")["mountPath"]
    relay_local = Path(tempfile.mkdtemp(prefix="relay-", dir="/tmp"))
    install(relay_local)
    variables = {"TRITON_ADMIN_KEY": "k"}

    def as_run(word: str) -> str:
        moved = [(directory, local), (relay_directory, relay_local)]
        return rewrite_paths(expand(word, variables), moved)

    command = [as_run(w) for w in triton["command"]]
    args = [as_run(w) for w in triton["args"]]
    # A stand-in server: records its arguments, then serves (sleeps) as the same process.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "args"
    server = bin_dir / "tritonserver"
    server.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {shlex.quote(str(seen))}\n'
        f"exec {shlex.quote(sys.executable)} -c 'import time; time.sleep(60)'\n"
    )
    server.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    process = subprocess.Popen([*command, *args], env=env, start_new_session=True)
    try:
        wait_until("the server's arguments", lambda: seen.exists() and seen.read_text(), 30)
        pid_file = local / Path(_pid_file(_containers(spec)["agent"])).name
        assert int(pid_file.read_text().split()[0]) == process.pid
        assert seen.read_text().splitlines() == args
        # The shell became Triton's keeper, which runs the server as its child and starts it
        # again at once when it dies.
        assert "tritonkeeper.py" in Path(f"/proc/{process.pid}/cmdline").read_text()
        server_pid = _server_in(TritonProcesses(pid_file))
        assert server_pid, "no server under the keeper"
        os.kill(server_pid, signal.SIGKILL)
        wait_until(
            "a new server", lambda: _server_in(TritonProcesses(pid_file)) not in (0, server_pid), 30
        )
        # The relay answers (NVML's own answer: this machine has no NVIDIA driver) from within
        # the server's tree, so the agent counts it as Triton's, never as a foreign process;
        # one that exits is started again.
        socket = relay_local / "nvml.sock"
        wait_until("the NVML relay's socket", socket.is_socket, 30)
        first = _relay_in(TritonProcesses(pid_file))
        os.kill(first, signal.SIGKILL)
        wait_until(
            "a new relay", lambda: _relay_in(TritonProcesses(pid_file)) not in (0, first), 30
        )
        reader = GpuReader(nvml=RelayedNvml(socket, timeout=10))
        try:
            deadline = time.monotonic() + 30
            while True:
                with pytest.raises(NvmlUnavailableError) as unusable:
                    reader.read()
                if "NVML Shared Library Not Found" in str(unusable.value):
                    break
                assert time.monotonic() < deadline, unusable.value  # the new one binds first
                time.sleep(0.05)
        finally:
            reader.close()
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        shutil.rmtree(relay_local, ignore_errors=True)
