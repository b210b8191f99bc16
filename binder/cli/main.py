"""`tritonshare` (and `kubectl tritonshare`): the command line, its flags and its subcommands.

Installed twice: as `tritonshare`, and as `kubectl-tritonshare` so that kubectl runs it as its
plugin (`kubectl tritonshare status`). Either way it finds the cluster as kubectl does:
--kubeconfig, $KUBECONFIG or ~/.kube/config, --context, and -n/--namespace (else the context's).
`status` and `explain` are `binder.cli.views`; `quarantine` is `binder.cli.quarantines`;
`preflight` is `binder.cli.preflight`; `uninstall-cleanup` is here, over `binder.cli.uninstall`.
Every subcommand reads the cluster and, but for `quarantine clear` and `uninstall-cleanup`,
changes nothing. It runs the binder's own code on what it reads, with the GPU memory reserve the
binder leader publishes on its Lease unless --gpu-mem-reserve is given.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

import yaml

from binder.api.kube import Kube
from binder.api.listwatch import NODES, QUOTAS, TRITONMODELS, leases_in
from binder.cli import preflight, uninstall
from binder.cli.quarantines import clear_quarantine, list_quarantines
from binder.cli.report import (
    asleep_keys,
    load_states,
    published_reserve,
    quarantined,
    replica_states,
    status_document,
    write_document,
    write_quarantined,
    write_reserve,
    write_unserved,
)
from binder.cli.views import (
    counted,
    explain_command,
    explain_target,
    fold,
    list_cluster,
    prog_name,
    status,
    write_usage,
)
from binder.errors import BinderError, SettingsError
from binder.framework.quota import usage
from common.contract import DEFAULT_PREFIX, DEFAULT_SCHEDULER_NAME, DEFAULT_SYSTEM_NAMESPACE, Keys
from common.kubeapi.errors import ApiError, KubeConfigError, NotFoundError, UnavailableError
from common.kubeapi.kubeconfig import kubeconfig_namespace
from common.kubeapi.session import RetryPolicy
from common.proofs import PlacementKeyError, load_key_ring
from common.settings import Declaration, Setting, key_prefix, one_of, quantity, text
from common.settings import path as directory
from common.version import VERSION, version_line

FLAGS = Declaration(
    "tritonshare",
    "The flags every command takes, before or after it, as kubectl's are.",
    [
        Setting(
            "kubeconfig",
            "kubeconfig file, or files joined by ':' (default: $KUBECONFIG, else ~/.kube/config, "
            "else the in-cluster service account)",
            env=None,
        ),
        Setting("context", "kubeconfig context (default: the current one)", env=None),
        Setting(
            "namespace",
            "namespace of what `explain` looks up when NAME has none (default: the context's, "
            "else default); `status` and `quarantine list` show only its pods, replicas and "
            "quarantines (default: every namespace's)",
            env=None,
            aliases=("-n",),
        ),
        Setting(
            "all-namespaces",
            "`status` and `quarantine list`: every namespace's (their default)",
            switch=True,
            env=None,
            aliases=("-A",),
        ),
        Setting("key-prefix", "prefix of the contract's keys", key_prefix, DEFAULT_PREFIX, "keys"),
        Setting(
            "system-namespace",
            "namespace of the agent leases and the binder leader's",
            text,
            DEFAULT_SYSTEM_NAMESPACE,
        ),
        Setting("scheduler-name", "spec.schedulerName of the pods", text, DEFAULT_SCHEDULER_NAME),
        Setting(
            "output",
            "text, json or yaml (json and yaml give bytes as integers, for scripts)",
            one_of("text", "json", "yaml"),
            "text",
            env=None,
            aliases=("-o",),
        ),
        Setting(
            "gpu-mem-reserve",
            "bytes kept free on every GPU (default: the value the binder leader publishes on "
            "its Lease, else 0)",
            quantity(),
        ),
        Setting(
            "placement-key-dir",
            "directory of the placement-key Secret's files, to verify proofs of placement as the "
            "binder does (default: proofs are checked for form only)",
            directory,
        ),
    ],
    error=SettingsError,
)
"""Added to the top parser and to each command's, so `explain POD -n models` works; a flag given
before the command is not reset by the command's parser (unset flags leave no attribute)."""


def build_parser(prog: str = "tritonshare") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog=prog, description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--version",
        action="version",
        version=version_line(prog),
        help="print the version of tritonshare and exit",
    )
    FLAGS.add_to(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    status_parser = commands.add_parser(
        "status", help="nodes and GPUs: capacity, allocated, free, models", allow_abbrev=False
    )
    status_parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also say how old the agents' figures may be and where the GPU memory reserve "
        "comes from (said without -v only when the reserve given differs from the binder's, "
        "or no binder has published one)",
    )
    FLAGS.add_to(status_parser)
    why = commands.add_parser(
        "explain",
        help="what the binder does with a pod, a TritonModel or an InferenceService, and why "
        "on each node",
        description="Explain a pod (POD, NAMESPACE/POD, pod/POD), a TritonModel (tm/NAME, "
        "tritonmodel/NAME, `tritonmodel NAME`: each replica's node, GPU and model host pod, and "
        "its GPU memory as declared, estimated or measured) or an InferenceService (isvc/NAME, "
        "`inferenceservice NAME`: its status as ModelMesh's, and the TritonModel it is served "
        "as, explained); a bare NAME is the pod of that name, else the TritonModel.",
        allow_abbrev=False,
    )
    why.add_argument("target", nargs="+", metavar="NAME", help="[KIND/][NAMESPACE/]NAME")
    FLAGS.add_to(why)
    quota = commands.add_parser(
        "quota",
        help="GPU memory quotas: what each namespace's pods and TritonModel replicas use",
        description="Each ResourceQuota limit on GPU memory, with what its namespace's pods and "
        "TritonModel replicas use of it together (the binder places neither past it).",
        allow_abbrev=False,
    )
    quota.add_argument("quota_namespace", nargs="?", metavar="NAMESPACE", help="only this one")
    FLAGS.add_to(quota)
    check = commands.add_parser(
        "preflight",
        help="what would break tritonshare on this cluster, and how to fix it",
        description="Check the cluster before and after installing: the Kubernetes version, Pod "
        "Security, the GPU nodes and the node pod's fit on each, the DaemonSets the GPU-node "
        "policy refuses (dry runs), the CNI, the Prometheus Operator's CRDs, the webhook's "
        "certificate and image pulls. Each check is ok, warn or fail with its fix; exits 1 when "
        "one fails. Needs list on nodes, namespaces, pods, daemonsets, CRDs, webhook "
        "configurations, admission policies and the system namespace's secrets, and create on "
        "pods for the dry runs (they store nothing).",
        allow_abbrev=False,
    )
    check.add_argument(
        "--pre",
        action="store_true",
        help="before installing: check against the chart's defaults and leave out what only an "
        "installed tritonshare has",
    )
    FLAGS.add_to(check)
    cleanup = commands.add_parser(
        "uninstall-cleanup",
        help="after uninstalling, remove the agents' node annotations and resources and the "
        "Leases tritonshare left behind",
        description="Remove what tritonshare wrote at run time and Helm or kustomize do not "
        "delete: the agents' annotations and extended resource on every Node, and the agents' "
        "and the binder leader's Leases in --system-namespace. Run it after the DaemonSet is "
        "gone: it refuses while an agent's Lease is live. Needs patch on nodes and nodes/status, "
        "list and delete on leases.",
        allow_abbrev=False,
    )
    cleanup.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would be removed and change nothing",
    )
    cleanup.add_argument(
        "--force",
        action="store_true",
        help="clean up even while agents' Leases are live (they write their annotations back)",
    )
    FLAGS.add_to(cleanup)
    quarantine = commands.add_parser(
        "quarantine", help="models and pods quarantined on a node after crashing its Triton"
    )
    actions = quarantine.add_subparsers(dest="action", required=True)
    clear = actions.add_parser(
        "clear",
        help="let a node load a quarantined model, or serve a quarantined pod, again",
        description="Ask NODE's agent to lift the quarantine of MODEL (NAMESPACE/MODEL-ID, a "
        "model id, a pod as NAMESPACE/NAME, or 12+ characters of its files' digest, as "
        "`tritonshare status` shows them). The agent lifts it within its Lease renewal period: "
        "it loads the model again if its pod still wants it, and the node gateway serves a pod "
        "whose requests were quarantined again. Refuses while a pod on NODE still wants the "
        "quarantined files (the agent lists them on the Node), unless --force. Needs get on pods "
        "and patch on nodes.",
        allow_abbrev=False,
    )
    clear.add_argument("node", help="the node the model is quarantined on")
    clear.add_argument("model", help="NAMESPACE/MODEL-ID (or what `status` shows)")
    clear.add_argument(
        "--force",
        action="store_true",
        help="clear even while a pod on the node still wants the quarantined files (the node "
        "loads them again: they crashed its Triton before)",
    )
    FLAGS.add_to(clear)
    listing = actions.add_parser(
        "list",
        help="what is quarantined, on every node or on NODE",
        description="Print each quarantine (node, kind: files, pod or namespace, namespace, "
        "pod or files' digest, since, crashes in a row, reason) as the nodes' agents publish "
        "them on their Nodes. Needs get and list on nodes.",
        allow_abbrev=False,
    )
    listing.add_argument("node", nargs="?", help="only this node")
    FLAGS.add_to(listing)
    FLAGS.add_to(quarantine)
    return parser


def uninstall_cleanup(
    kube: Kube, keys: Keys, system_namespace: str, args: argparse.Namespace, prog: str, out: TextIO
) -> int:
    """`uninstall-cleanup`: 0 when done (or nothing was left), 1 when agents still run."""
    nodes = kube.list_all(NODES)[0]
    leases = kube.list_all(leases_in(system_namespace))[0]
    cleanup = uninstall.plan(nodes, leases, keys, time.time())
    if cleanup.live_agents and not args.force:
        print(
            f"{prog}: the agents of {counted(len(cleanup.live_agents), 'node')} still run "
            f"({', '.join(cleanup.live_agents)}) and would write their annotations back: "
            f"uninstall tritonshare first (its DaemonSet), wait until their Leases run out, or "
            f"pass --force if those nodes are gone",
            file=sys.stderr,
        )
        return 1
    if cleanup.empty:
        out.write("Nothing to clean up: no node or Lease carries what tritonshare writes.\n")
        return 0
    for line in cleanup.describe():
        out.write(("would " if args.dry_run else "") + line + "\n")
    if args.dry_run:
        return 0
    uninstall.carry_out(kube, cleanup, system_namespace)
    touched = len(set(cleanup.annotations) | set(cleanup.resources))
    out.write(
        f"Removed tritonshare's annotations and resources from {counted(touched, 'node')} and "
        f"deleted {counted(len(cleanup.leases), 'Lease')} in {system_namespace}.\n"
    )
    return 0


def kubeconfig_path(flag: str | None, environ: Mapping[str, str], home: Path) -> str | None:
    """The kubeconfig kubectl would use: --kubeconfig, else $KUBECONFIG (a ':'-joined list is
    merged), else ~/.kube/config when it exists; None means the in-cluster service account."""
    if flag:
        return flag
    if environ.get("KUBECONFIG"):
        return environ["KUBECONFIG"]
    default = home / ".kube" / "config"
    return str(default) if default.exists() else None


def current_context(kubeconfig: str) -> str | None:
    """The current context of a ':'-joined kubeconfig list as kubectl picks it: from the first
    file that sets one. (The Python client's merge lets the last file win instead.)"""
    for path in kubeconfig.split(os.pathsep):
        try:
            document = yaml.safe_load(Path(path).expanduser().read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(document, dict) and document.get("current-context"):
            return str(document["current-context"])
    return None


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run one command; returns the exit code: 0 done, 1 the cluster could not be read (or the
    pod does not exist), 2 bad flags or kubeconfig, 141 the reader of the output went away."""
    out = out or sys.stdout
    try:
        code = _run(argv, out)
        out.flush()
    except BrokenPipeError:
        # The reader went away (`tritonshare status | head`): there is no one left to tell, so
        # no traceback. stdout now points at /dev/null, or Python's own flush at exit fails
        # again. 141 is what a shell reports for a command that SIGPIPE ended.
        if out is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return 128 + signal.SIGPIPE
    return code


def _run(argv: Sequence[str] | None, out: TextIO) -> int:
    prog = prog_name(sys.argv[0])
    args = build_parser(prog).parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        flags = FLAGS.resolve(vars(args), os.environ)
    except SettingsError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    keys: Keys = flags["keys"]
    given_reserve: int | None = flags.get("gpu_mem_reserve")
    system_namespace: str = flags["system_namespace"]
    scheduler_name: str = flags["scheduler_name"]
    output: str = flags["output"]
    given_context: str | None = flags.get("context")
    kubeconfig = kubeconfig_path(flags.get("kubeconfig"), os.environ, Path.home())
    if kubeconfig is None and given_context:
        print(
            f"{prog}: --context {given_context} needs a kubeconfig, and none was found: pass "
            f"--kubeconfig, set KUBECONFIG, or write ~/.kube/config",
            file=sys.stderr,
        )
        return 2
    context = given_context or (current_context(kubeconfig) if kubeconfig else None)
    key_dir: Path | None = flags.get("placement_key_dir")
    try:
        ring = load_key_ring(key_dir) if key_dir is not None else None
    except PlacementKeyError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    try:
        context_namespace = kubeconfig_namespace(kubeconfig, context) if kubeconfig else None
        kube = Kube(
            kubeconfig,
            context=context,
            user_agent=f"tritonshare-cli/{VERSION}",
            retry=RetryPolicy(),
        )
    except (BinderError, KubeConfigError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    try:
        if args.command == "preflight":
            return preflight.preflight(
                kube, keys, system_namespace, args.pre, output, out, time.time()
            )
        if args.command == "uninstall-cleanup":
            return uninstall_cleanup(kube, keys, system_namespace, args, prog, out)
        # -n narrows the lists to a namespace; -A (their default) or no -n shows every one.
        only = None if flags.get("all_namespaces") else flags.get("namespace")
        if args.command == "quarantine" and args.action == "list":
            return list_quarantines(kube, keys, args, output, out, only)
        if args.command == "quarantine":
            return clear_quarantine(kube, keys, args, out)
        listing = list_cluster(kube, system_namespace)
        published = published_reserve(listing.leases, keys)
        reserve = given_reserve if given_reserve is not None else published or 0
        cache = fold(listing, keys, scheduler_name, reserve, ring)
        now = time.time()
        if args.command == "quota":
            cache.replace_quotas(kube.list_all(QUOTAS)[0])
            with contextlib.suppress(NotFoundError):  # no TritonModel CRD: no replicas
                cache.models.replace_models(kube.list_all(TRITONMODELS)[0])
            write_usage(usage(cache.ledger, keys, args.quota_namespace), output, out)
            return 0
        if args.command == "status":
            states = load_states(listing.pods, keys.model_loaded)
            states.update(replica_states(listing.models))
            charged = [p for name in cache.state.names for p, _ in cache.state.pods_on(name)]
            asleep = asleep_keys(listing.pods, charged, keys)
            held = [r for r in quarantined(listing.nodes, keys) if only in (None, r["namespace"])]
            if output == "text":
                status(cache, out, now, only, asleep, notes=args.verbose)
                write_unserved(cache, states, out, only)
                write_quarantined(held, out)
                write_reserve(reserve, given_reserve, published, out, always=args.verbose)
            else:
                document = status_document(cache, now, states, only, asleep)
                document["quarantined"] = held
                write_document(document, output, out)
            return 0
        try:
            kind, namespace, name = explain_target(args.target)
        except ValueError as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return 2
        namespace = namespace or flags.get("namespace") or context_namespace or "default"
        target = (kind, namespace, name)
        return explain_command(kube, keys, cache, target, output, out, now, listing.models)
    except UnavailableError as e:
        if e.status == 0:
            print(
                f"{prog}: the cluster could not be read: the API server {kube.server} cannot be "
                f"reached ({e.message.removeprefix('the API server could not be reached: ')}); "
                f"check --kubeconfig and --context (now {kubeconfig or 'in-cluster'}, "
                f"{context or 'its current context'}) and that the cluster is up",
                file=sys.stderr,
            )
        else:
            print(
                f"{prog}: the cluster could not be read: the API server {kube.server} is "
                f"unavailable ({e.status} {e.reason}: {e.message}); try again later",
                file=sys.stderr,
            )
        return 1
    except (BinderError, ApiError) as e:
        print(f"{prog}: the cluster could not be read: {e}", file=sys.stderr)
        return 1
    finally:
        kube.close()


if __name__ == "__main__":
    sys.exit(main())
