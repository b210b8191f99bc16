"""`tritonshare quarantine list` and `quarantine clear`: what the nodes' agents quarantined (from
their Nodes' annotations, read by `binder.cli.report.quarantined`), and asking an agent to lift
one, refused while a pod on the node still wants the quarantined files unless --force.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TextIO

from binder.api.kube import Kube
from binder.api.listwatch import NODES
from binder.cli.report import (
    quarantined,
    write_document,
    write_quarantine_list,
)
from binder.cli.views import prog_name
from binder.cluster.objects import TERMINATED_PHASES
from common.contract import Keys
from common.kubeapi.errors import NotFoundError


def list_quarantines(
    kube: Kube,
    keys: Keys,
    args: argparse.Namespace,
    output: str,
    out: TextIO,
    namespace: str | None = None,
) -> int:
    """`quarantine list [NODE]` (of `namespace` alone when given): 1 when NODE does not
    exist."""
    nodes = kube.list_all(NODES)[0]
    if args.node:
        nodes = [n for n in nodes if n["metadata"]["name"] == args.node]
        if not nodes:
            print(f"{prog_name(sys.argv[0])}: node {args.node} does not exist", file=sys.stderr)
            return 1
    rows = [r for r in quarantined(nodes, keys) if namespace in (None, r["namespace"])]
    if output == "text":
        write_quarantine_list(rows, out)
    else:
        write_document({"quarantined": rows}, output, out)
    return 0


def clear_quarantine(kube: Kube, keys: Keys, args: argparse.Namespace, out: TextIO) -> int:
    """`quarantine clear NODE MODEL`: write the node's `quarantine-clear` annotation, which its
    agent carries out and removes; 1 when the node does not exist or quarantines no such model."""
    prog = prog_name(sys.argv[0])
    nodes = [n for n in kube.list_all(NODES)[0] if n["metadata"]["name"] == args.node]
    if not nodes:
        print(f"{prog}: node {args.node} does not exist", file=sys.stderr)
        return 1
    held = quarantined(nodes, keys)
    wanted = str(args.model)
    named = [row for row in held if _names(row, wanted)]
    if not named:
        there = ", ".join(sorted({str(row["model"]) for row in held})) or "none"
        print(
            f"{prog}: node {args.node} quarantines no model {wanted} (it quarantines: {there}); "
            f"`tritonshare quarantine list` lists them",
            file=sys.stderr,
        )
        return 1
    for row in named if not args.force else []:
        pods = _still_wanting(kube, row)
        if pods:
            print(
                f"{prog}: pod {', '.join(pods)} on node {args.node} still wants the files of "
                f"{row['model']} (digest {row['digest'][:12]}), which crashed its Triton "
                f"{row['crashes']} times in a row: cleared now, the node loads them again and "
                f"every model on it goes down with Triton each time. Delete the pod or give it "
                f"fixed files first, or pass --force",
                file=sys.stderr,
            )
            return 1
    kube.merge_patch_node(args.node, {"metadata": {"annotations": {keys.quarantine_clear: wanted}}})
    out.write(
        f"Asked the agent of node {args.node} to lift the quarantine of {wanted}; "
        f"`tritonshare status` stops listing it once it has.\n"
    )
    return 0


def _still_wanting(kube: Kube, row: Mapping[str, object]) -> list[str]:
    """The pods the node's agent shows wanting a quarantined entry's files that still exist
    and have not finished (the agent's annotation may be a renewal period old)."""
    found = []
    wanted_by = row.get("wanted_by")
    for key in wanted_by if isinstance(wanted_by, list) else []:
        namespace, _, name = str(key).partition("/")
        try:
            pod = kube.read_pod(namespace, name)
        except NotFoundError:
            continue
        if (pod.get("status") or {}).get("phase") not in TERMINATED_PHASES:
            found.append(str(key))
    return found


def _names(row: Mapping[str, object], selector: str) -> bool:
    """Whether `selector` names a quarantined model as the agent matches it
    (`agent.quarantine.crashledger.CrashRecord.matches`)."""
    model, digest = str(row["model"]), str(row["digest"])
    return selector in (model, model.partition("/")[2], str(row["pod"])) or (
        len(selector) >= 12 and digest.startswith(selector)
    )
