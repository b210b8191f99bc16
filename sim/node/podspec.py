"""Turn one container of a pod into a process launch, as a kubelet would prepare it.

Owns the pure part of the simulated kubelet: environment variables with the Downward API
(`fieldRef`), Kubernetes' `$(VAR)` expansion, the image's `python` mapped to this interpreter, the
entrypoints of the images it has stand-ins for (`IMAGE_ENTRYPOINTS`), volume mount paths rewritten
to the local directories that stand in for the mounts, and the pod's stand-in network namespace
(`sim.node.podnetwork`). It reads no clock, starts nothing and calls no API; `sim.node.kubelet`
does that.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.node.podnetwork import PodNetwork

Obj = Mapping[str, Any]

DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
# A process here shares the host's filesystem, so a path a program picks itself (not one the pod
# spec names, which is rewritten) would land on the host. The tritonshare image's programs take
# those from variables, which every container gets, pointing into its pod's directory: the
# termination file the kubelet mounts at terminationMessagePath (the loader's default is
# /dev/termination-log), and the temporary directory of the container's own filesystem.
TERMINATION_LOG_VARIABLE = "TRITONSHARE_TERMINATION_LOG"
TEMPORARY_DIRECTORY_VARIABLE = "TMPDIR"

_VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD_RE = re.compile(r"^metadata\.(annotations|labels)\['([^']+)'\]$")
# The image's interpreter is ours: the demo and tests run the parts with this Python.
_PYTHONS = frozenset({"python", "python3", "python3.11", "/usr/local/bin/python"})
# Images whose entrypoint has a local stand-in, for containers that give no command (as the
# pods the tritonshare webhook writes give none for KServe's storage initializer: its args are
# [URI, directory]). Keyed by repository, without registry host or tag.
IMAGE_ENTRYPOINTS: Mapping[str, tuple[str, ...]] = {
    "kserve/storage-initializer": ("python", "-m", "sim.node.storage_initializer"),
}


class PodSpecError(ValueError):
    """The pod asks for something the simulated kubelet cannot provide; the message says what."""


@dataclass(frozen=True)
class Launch:
    """How to start one container as a local process."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    termination_log: Path
    scratch: Path | None = None
    """The stand-in for the container's own writable filesystem (its /tmp), when it has one."""


def field_value(pod: Obj, path: str) -> str:
    """A Downward API `fieldRef.fieldPath` of `pod`, as the kubelet resolves it."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIP": status.get("podIP", ""),
    }
    if path in simple:
        return str(simple[path])
    match = _FIELD_RE.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise PodSpecError(f"fieldRef {path!r} is not supported by the simulated kubelet")


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: known names are replaced, `$$` is a literal `$`, and an
    unknown reference is left as written (as the kubelet does)."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return variables.get(name, match.group(0))

    return _VAR_RE.sub(replace, text)


def rewrite_paths(text: str, mounts: Sequence[tuple[str, Path]]) -> str:
    """Replace each mount path (as a whole path component) in `text` by its local directory, in
    one pass: a local directory that itself lies under a mount path (a `/tmp` mount, with the
    volumes under /tmp) is not rewritten again. Where mount paths nest, the longest wins."""
    if not mounts:
        return text
    locals_by_path = {m.rstrip("/"): str(local) for m, local in mounts}
    alternatives = "|".join(re.escape(m) for m in sorted(locals_by_path, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w./-])({alternatives})(?=/|$|[\s:,;])")
    return pattern.sub(lambda match: locals_by_path[match.group(1)], text)


def container_env(pod: Obj, container: Obj) -> dict[str, str]:
    """The container's declared environment, Downward API resolved and `$(VAR)` expanded in
    declaration order (a variable sees only the ones declared before it)."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        source = item.get("valueFrom", {})
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        else:
            kinds = ", ".join(sorted(source)) or "nothing"
            raise PodSpecError(
                f"env {name!r} of container {container.get('name')!r} comes from {kinds}; the "
                "simulated kubelet resolves only value and fieldRef"
            )
    return env


def image_repository(image: str) -> str:
    """`image` without its digest, tag and registry host: `kserve/storage-initializer` for
    `docker.io/kserve/storage-initializer:v0.14.1`."""
    name = image.partition("@")[0]
    head, _, tail = name.rpartition("/")
    name = f"{head}/{tail.partition(':')[0]}" if head else tail.partition(":")[0]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return rest
    return name


def plan(
    pod: Obj,
    container: Obj,
    *,
    mounts: Mapping[str, Path],
    termination_log: Path,
    base_env: Mapping[str, str],
    python: str = sys.executable,
    network: PodNetwork | None = None,
    scratch: Path | None = None,
) -> Launch:
    """The launch of `container`.

    `mounts` maps each volume name to its local directory; a volumeMount's `subPath` is a
    subdirectory of it. The container's terminationMessagePath is rewritten to `termination_log`,
    and given in TRITONSHARE_TERMINATION_LOG for a program that writes it by default. `scratch`
    stands in for the container's own /tmp (TMPDIR), unless a volume is mounted there.
    `network` is the pod's stand-in network namespace (None on the host network).
    """
    command = list(container.get("command", []))
    args = list(container.get("args", []))
    if not command:
        entrypoint = IMAGE_ENTRYPOINTS.get(image_repository(str(container.get("image", ""))))
        if entrypoint is None:
            known = ", ".join(sorted(IMAGE_ENTRYPOINTS))
            raise PodSpecError(
                f"container {container.get('name')!r} has no command; the simulated kubelet "
                f"knows the entrypoints of {known} only, so give the command (e.g. python -m "
                "loader)"
            )
        command = list(entrypoint)
    path_map: list[tuple[str, Path]] = []
    for mount in container.get("volumeMounts", []):
        volume = mount["name"]
        if volume not in mounts:
            raise PodSpecError(f"volumeMount {volume!r} names no volume of the pod")
        local = mounts[volume] / mount["subPath"] if mount.get("subPath") else mounts[volume]
        path_map.append((mount["mountPath"], local))
    message_path = container.get("terminationMessagePath", DEFAULT_TERMINATION_MESSAGE_PATH)
    path_map.append((message_path, termination_log))
    # Longest first, so /var/run/secrets/x is rewritten before a mount at /var/run.
    path_map.sort(key=lambda item: len(item[0]), reverse=True)

    declared = container_env(pod, container)
    tmp = rewrite_paths("/tmp", path_map)  # noqa: S108  (the container's /tmp, mapped)
    standins = {TERMINATION_LOG_VARIABLE: str(termination_log)}
    if tmp != "/tmp":  # noqa: S108
        standins[TEMPORARY_DIRECTORY_VARIABLE] = tmp
    elif scratch is not None:
        standins[TEMPORARY_DIRECTORY_VARIABLE] = str(scratch / "tmp")
    env = {
        **base_env,
        **standins,
        **{k: rewrite_paths(v, path_map) for k, v in declared.items()},
    }
    argv = [rewrite_paths(expand(a, declared), path_map) for a in command + args]
    if network is not None:
        env.update({k: network.rewrite(env[k]) for k in declared})
        env.update(network.environment(declared))
        argv = [network.rewrite(a) for a in argv]
    if argv[0] in _PYTHONS:
        argv[0] = python
    return Launch(
        name=str(container["name"]),
        argv=tuple(argv),
        env=env,
        termination_log=termination_log,
        scratch=scratch,
    )
