"""`make demo`: tritonshare end to end on a simulated cluster, with a real Triton on the CPU.

Starts the cluster of `sim.demo.scenario` (four GPU nodes in three pools, one tainted; an agent per
node; two binders; the local node's kubelet), creates the model pods, waits for the binder to
place them, sends inferences through the proxies of the pods that run for real, and prints what a
newcomer should see: a metrics summary (printed where it is scraped, after the first
inferences); nodes, GPUs and the models on each, and the pending pods with the binder's reasons.
It rolls a model's Deployment to new model files while a client sends steadily, and says
whether any request failed (`sim.demo.rollout`), and scales a model Deployment out on
concurrency and back (`sim.demo.autoscale`, with a real Prometheus when it is installed). Then
it deletes the model pods (the proxies drain and unload their models), stops everything and
exits 0. `run_demo` returns the
facts for the end-to-end test.
Whatever part of the product is missing from the tree is said plainly, never simulated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from common.contract import Keys
from common.quantity import format_bytes
from common.tritonname import private_triton_name
from sim.cluster import EXAMPLE_NAMESPACE_MANIFEST, SimCluster, apply_namespace
from sim.demo import autoscale, gpucheck, rollout
from sim.demo.agentreads import read_pod
from sim.demo.gpuburst import BURST
from sim.demo.report import (
    ALL_PODS,
    INTRO,
    DemoResult,
    Say,
    print_tables,
    scrape,
    summarize_metrics,
)
from sim.demo.scenario import (
    GREEDY_POD,
    LATE_POD,
    MODELS_DIR,
    NAMESPACE,
    NODES,
    PODS,
    SHORT_FORM_PORTS,
    ModelPod,
    PodPorts,
    model_pod_manifest,
    short_form_manifest,
)
from sim.processes import ClusterError, wait_until
from sim.triton import PARALLEL_LOADS, free_port

KEYS = Keys()


def _address(cluster: SimCluster, name: str) -> str:
    """The pod's own IP, where its proxy listens."""
    return str((read_pod(cluster, name) or {}).get("status", {}).get("podIP", ""))


def _condition(pod: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in (pod or {}).get("status", {}).get("conditions", []) or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def _create_pods(cluster: SimCluster, result: DemoResult, say: Say) -> dict[str, PodPorts]:
    node, gateway = cluster.real_node, cluster.gateway
    assert node is not None and gateway is not None
    agent = cluster.agents.get(node.name)
    agent_port = int(agent.grpc.rpartition(":")[2]) if agent else free_port()
    # The example's namespace as shipped: its model pods run at the restricted level.
    assert apply_namespace(cluster.core.api_client, EXAMPLE_NAMESPACE_MANIFEST) == NAMESPACE
    ports: dict[str, PodPorts] = {}
    for pod in PODS:
        if pod.short_form and cluster.model_store is not None:
            _create_short_form(cluster, pod, result, say)
            ports[pod.name] = SHORT_FORM_PORTS
            continue
        ports[pod.name] = PodPorts(free_port(), free_port(), free_port())
        manifest = model_pod_manifest(
            pod,
            ports[pod.name],
            agent_port=agent_port,
            gateway_http_port=gateway.http,
            gateway_grpc_port=gateway.grpc,
        )
        cluster.core.create_namespaced_pod(NAMESPACE, manifest, _preload_content=False)
    return ports


def _create_short_form(cluster: SimCluster, pod: ModelPod, result: DemoResult, say: Say) -> None:
    """Publish the pod's model to the model store and create the pod as a team writes it; the
    webhook completes it on the way in."""
    assert cluster.model_store is not None
    uri = cluster.model_store.publish(pod.model_id, MODELS_DIR / pod.source)
    manifest = short_form_manifest(pod, uri)
    cluster.core.create_namespaced_pod(NAMESPACE, manifest, _preload_content=False)
    created = read_pod(cluster, pod.name) or {}
    spec = created.get("spec", {})
    result.short_form[pod.name] = {
        "annotations": dict(created.get("metadata", {}).get("annotations", {})),
        "schedulerName": spec.get("schedulerName", ""),
        "initContainers": [
            {"name": c["name"], "image": c.get("image", ""), "args": c.get("args", [])}
            for c in spec.get("initContainers", [])
        ],
        "containers": [c["name"] for c in spec.get("containers", [])],
    }
    written = ", ".join(f"{k}: {v}" for k, v in manifest["metadata"]["annotations"].items())
    made = result.short_form[pod.name]
    inits = ", ".join(f"{c['name']} ({c['image']})" for c in made["initContainers"])
    say(f"{pod.name} is written in the short form: {written}.")
    say(
        f"  tritonshare's webhook completed it: schedulerName {made['schedulerName']}, model id "
        f"{made['annotations'].get(KEYS.model_id)}, init containers {inits}, containers "
        f"{', '.join(made['containers'])}."
    )


def _wait_for_placement(cluster: SimCluster, result: DemoResult, say: Say) -> None:
    def decided() -> bool:
        for pod in PODS:
            current = read_pod(cluster, pod.name)
            node = (current or {}).get("spec", {}).get("nodeName")
            scheduled = _condition(current, "PodScheduled")
            if node:
                gpu = (current or {})["metadata"].get("annotations", {}).get(KEYS.gpu, "")
                result.placements[pod.name] = (node, gpu)
            elif scheduled.get("status") == "False":
                result.pending[pod.name] = str(scheduled.get("message", ""))
            else:
                return False
        return True

    wait_until("the binder deciding every model pod", decided, 60)
    say(f"The binder placed {len(result.placements)} pods and explained {len(result.pending)}.")


def _wait_for_ready(cluster: SimCluster, result: DemoResult, say: Say) -> None:
    real = cluster.real_node
    assert real is not None
    local = [p for p, (node, _) in result.placements.items() if node == real.name]
    say(
        f"On {real.name}, each pod's loader streams its model to the agent, which loads it into "
        f"Triton pinned to the chosen GPU; then the proxy starts: {', '.join(local)}."
    )

    def ready() -> bool:
        for name in local:
            pod = read_pod(cluster, name)
            failed = [
                s
                for s in (pod or {}).get("status", {}).get("initContainerStatuses", []) or []
                if s.get("restartCount", 0) > 0
            ]
            if failed:
                message = failed[0].get("lastState", {}).get("terminated", {}).get("message", "")
                raise ClusterError(f"pod {name}: {failed[0]['name']} failed: {message}")
            if _condition(pod, "Ready").get("status") != "True":
                return False
        return True

    try:
        wait_until("the model pods on the real node becoming Ready", ready, 120)
    except ClusterError as e:
        unready = [
            n for n in local if _condition(read_pod(cluster, n), "Ready").get("status") != "True"
        ]
        name = (unready or local)[0]
        assert cluster.kubelet is not None
        log = cluster.kubelet.container_log(NAMESPACE, name, "proxy").splitlines()[-12:]
        raise ClusterError(
            f"{e} Not ready: {', '.join(unready) or '-'}; {name}'s proxy log ends:\n"
            + "\n".join(log)
        ) from e
    result.served = local


def _fail_over(cluster: SimCluster, result: DemoResult, say: Say) -> None:
    """Crash the leader binder; the follower takes the lease over and binds the next pod."""
    if len(cluster.binders) < 2 or not result.leader:
        return
    say("")
    say(f"Crashing the leader binder ({result.leader}, SIGKILL): its lease must expire first.")
    crashed_at = time.monotonic()
    cluster.crash_binder(result.leader)
    manifest = model_pod_manifest(
        LATE_POD,
        PodPorts(free_port(), free_port(), free_port()),
        agent_port=free_port(),
        gateway_http_port=free_port(),
        gateway_grpc_port=free_port(),
    )
    cluster.core.create_namespaced_pod(NAMESPACE, manifest, _preload_content=False)

    def bound() -> str:
        pod = read_pod(cluster, LATE_POD.name)
        return str((pod or {}).get("spec", {}).get("nodeName") or "")

    node = wait_until(f"the new leader binding {LATE_POD.name}", bound, 60)
    result.new_leader = cluster.binder_leader()
    result.failover_seconds = time.monotonic() - crashed_at
    gpu = (
        (read_pod(cluster, LATE_POD.name) or {})["metadata"]
        .get("annotations", {})
        .get(KEYS.gpu, "")
    )
    result.placements[LATE_POD.name] = (node, gpu)
    say(
        f"{result.new_leader} took over and bound {LATE_POD.name} to {node} "
        f"{result.failover_seconds:.1f} s after the crash."
    )


def _infer(cluster: SimCluster, ports: dict[str, PodPorts], result: DemoResult, say: Say) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    ids = {p.name: p.model_id for p in PODS}
    for name in result.served:
        port = ports[name]
        model = ids[name]
        address = _address(cluster, name)
        http = httpclient.InferenceServerClient(f"{address}:{port.http}")
        try:
            source = next(p.source for p in PODS if p.name == name)
            data = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
            if source == "add_one":
                tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
                output = "OUTPUT0"
            else:
                data = data[0]
                tensor = httpclient.InferInput("INPUT_FP32", list(data.shape), "FP32")
                output = "OUTPUT_FP32"
            tensor.set_data_from_numpy(data)
            answer = http.infer(model, [tensor]).as_numpy(output)
            result.inferences[name] = [float(x) for x in answer.reshape(-1)]
            sent, got = data.reshape(-1).tolist(), answer.reshape(-1).tolist()
            say(f"  REST {name}: {model}({sent}) = {got}")
            if source == "add_one":
                with grpcclient.InferenceServerClient(f"{address}:{port.grpc}") as grpc:
                    g = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
                    g.set_data_from_numpy(data)
                    out = grpc.infer(model, [g]).as_numpy("OUTPUT0").reshape(-1).tolist()
                    say(f"  gRPC {name}: {model}({data.reshape(-1).tolist()}) = {out}")
            other = next((ids[n] for n in result.served if n != name), None)
            if other is not None:
                try:
                    http.get_model_metadata(other)
                except InferenceServerException as e:
                    result.isolation_refused = True
                    say(
                        f"  {name}'s proxy refuses model {other!r} (another tenant's): "
                        f"{str(e).splitlines()[0][:90]}"
                    )
        finally:
            http.close()


SQUATTER_NAMESPACE = "intruders"


def _squat(cluster: SimCluster, result: DemoResult, say: Say) -> None:
    """Another team creates a pod with spec.nodeName set (so the binder never sees it) and the
    model id of a model already served on that node: the agent refuses it, and says so on it."""
    real = cluster.real_node
    victim = next((p for p in PODS if p.name in result.served), None)
    if real is None or victim is None:
        return
    say("")
    say(
        f"Another team ({SQUATTER_NAMESPACE}) creates a pod with spec.nodeName={real.name} and "
        f"model id {victim.model_id!r}, {victim.name}'s model, bypassing the binder:"
    )
    cluster.core.create_namespace(
        {"metadata": {"name": SQUATTER_NAMESPACE}}, _preload_content=False
    )
    manifest = model_pod_manifest(
        replace(victim, name="squatter"),
        PodPorts(free_port(), free_port(), free_port()),
        agent_port=0,
        gateway_http_port=0,
        gateway_grpc_port=0,
    )
    agent = cluster.agents[real.name].grpc
    for container in manifest["spec"]["initContainers"]:
        container["args"] = [
            f"--agent-address={agent}" if a.startswith("--agent-address=") else a
            for a in container.get("args", [])
        ]
    manifest["metadata"]["namespace"] = SQUATTER_NAMESPACE
    manifest["spec"]["nodeName"] = real.name
    cluster.core.create_namespaced_pod(SQUATTER_NAMESPACE, manifest, _preload_content=False)

    def refused() -> str:
        response = cluster.core.list_namespaced_event(
            SQUATTER_NAMESPACE,
            field_selector="involvedObject.name=squatter",
            _preload_content=False,
        )
        for event in json.loads(response.data).get("items", []):
            # The binder reports the pod too (it charges nothing for it); the agent's is wanted.
            component = str((event.get("source") or {}).get("component", ""))
            if event.get("reason") == "NotPlacedByBinder" and component.startswith(
                "tritonshare-agent"
            ):
                return str(event.get("message", ""))
        return ""

    message = wait_until("the agent refusing the squatter pod", refused, 90)
    result.squatter_refused = message
    why = message.split(": ", 1)[-1].split(";")[0]
    say(f"  the agent refused it, with a Warning Event NotPlacedByBinder on the pod: {why}.")
    cluster.core.delete_namespaced_pod(
        "squatter", SQUATTER_NAMESPACE, grace_period_seconds=0, _preload_content=False
    )


_KNOCK = """
import os, socket, sys
host, port, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
request = f"GET /v2/models/{model}/ready HTTP/1.1\\r\\nHost: triton\\r\\n\\r\\n".encode()
try:
    with socket.create_connection((host, port), 10, (os.environ["POD_IP"], 0)) as s:
        s.sendall(request)
        answer = s.recv(200).split(b"\\r\\n", 1)[0].decode() or "the connection was closed"
except OSError as e:
    answer = f"the connection was refused ({e.strerror or e})"
print(f"from {os.environ['POD_IP']}: {answer}", flush=True)
"""


def _knock_from(address: str, gateway: str, model: str) -> str:
    """The first line of the gateway's answer to `address` asking whether `model` is ready."""
    host, _, port = gateway.rpartition(":")
    request = f"GET /v2/models/{model}/ready HTTP/1.1\r\nHost: triton\r\n\r\n".encode()
    try:
        with socket.create_connection((host, int(port)), 10, (address, 0)) as sock:
            sock.sendall(request)
            answer = sock.recv(200).split(b"\r\n", 1)[0].decode()
            return answer or "the connection was closed"
    except OSError as e:
        return f"the connection was refused ({e.strerror or e})"


def _gateway(cluster: SimCluster, result: DemoResult, say: Say) -> None:
    """Only a model pod's own address reaches Triton, and only for its own model: a pod that is
    no model pod (with a forged model label) and a model pod asking for its neighbour's model,
    both stopped at the node's gateway."""
    real, gateway = cluster.real_node, cluster.gateway
    if real is None or gateway is None or cluster.kubelet is None:
        return
    served = [p for p in PODS if p.name in result.served]
    if len(served) < 2:
        return
    tenant, neighbour = served[0], served[1]
    say("")
    say(
        f"Triton on {real.name} is reachable only through the node's gateway, which knows each "
        "pod by its address:"
    )
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "stranger",
            "namespace": SQUATTER_NAMESPACE,
            "labels": {"tritonshare.io/role": "model"},  # forged: labels prove nothing
        },
        "spec": {
            "nodeName": real.name,
            # Without it the kubelet refuses the pod; with it, on a cluster running the admission
            # policies, the API server does (it is no model pod). The demo runs without them, to
            # show that the gateway stops such a pod as well.
            "tolerations": [KEYS.gpu_node_toleration()],
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "knock",
                    "image": "tritonshare:demo",
                    "command": ["python", "-c", _KNOCK],
                    "args": ["$(HOST_IP)", str(gateway.http), tenant.model_id],
                    "env": [
                        {
                            "name": "POD_IP",
                            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                        },
                        {
                            "name": "HOST_IP",
                            "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
                        },
                    ],
                }
            ],
        },
    }
    cluster.core.create_namespaced_pod(SQUATTER_NAMESPACE, manifest, _preload_content=False)
    kubelet = cluster.kubelet

    def knocked() -> str:
        return kubelet.container_log(SQUATTER_NAMESPACE, "stranger", "knock").strip()

    result.gateway_stranger = wait_until("the stranger pod's attempt", knocked, 60)
    say(
        f"  a pod of {SQUATTER_NAMESPACE} labelled as a model pod asks for {tenant.model_id!r}: "
        f"{result.gateway_stranger}"
    )
    cluster.core.delete_namespaced_pod(
        "stranger", SQUATTER_NAMESPACE, grace_period_seconds=0, _preload_content=False
    )
    pod = read_pod(cluster, tenant.name) or {}
    address = str(pod.get("status", {}).get("podIP", ""))
    own = _knock_from(address, f"127.0.0.1:{gateway.http}", tenant.model_id)
    result.gateway_neighbour = _knock_from(address, f"127.0.0.1:{gateway.http}", neighbour.model_id)
    say(
        f"  {tenant.name} ({address}) asks for its own model {tenant.model_id!r}: {own}; for "
        f"{neighbour.name}'s {neighbour.model_id!r}: {result.gateway_neighbour} (as Triton "
        "answers a model it does not have)"
    )


TRITONMODELS = {"tm-add-one": "add_one", "tm-add-two": "add_one", "tm-identity": "identity"}
"""The demo's TritonModels and the shipped model each serves."""


def _tritonmodels(cluster: SimCluster, result: DemoResult, say: Say) -> None:
    """Three models of the namespace as TritonModels on the real node: one model host serves
    them all (one pod slot), beside the namespace's model pods (a slot each)."""
    import numpy as np
    import tritonclient.http as httpclient
    from kubernetes import client

    real = cluster.real_node
    if cluster.model_store is None or real is None or not cluster.binders:
        say("No model store or binder: the TritonModels step is skipped.")
        return
    custom = cast(Any, client.CustomObjectsApi(cluster.kube))
    say("")
    say(
        f"Three models as TritonModels, no pod of their own: {', '.join(TRITONMODELS)} "
        f"(each 512Mi, pinned to {real.name} with a nodeSelector)."
    )
    for name, source in TRITONMODELS.items():
        uri = cluster.model_store.publish(name, MODELS_DIR / source, release="tritonmodels")
        body = {
            "apiVersion": "tritonshare.io/v1alpha1",
            "kind": "TritonModel",
            "metadata": {"name": name},
            "spec": {
                "storageUri": uri,
                "gpuMemory": "512Mi",
                "nodeSelector": {"kubernetes.io/hostname": real.name},
            },
        }
        custom.create_namespaced_custom_object(
            "tritonshare.io", "v1alpha1", NAMESPACE, "tritonmodels", body
        )

    def ready() -> bool:
        models = custom.list_namespaced_custom_object(
            "tritonshare.io", "v1alpha1", NAMESPACE, "tritonmodels"
        )["items"]
        return sum((m.get("status") or {}).get("readyReplicas") or 0 for m in models) == len(
            TRITONMODELS
        )

    wait_until("the TritonModels served by their model host", ready, 120)
    hosts = cluster.core.list_namespaced_pod(
        NAMESPACE, label_selector=f"{KEYS.prefix}model-host=true"
    ).items
    on_node = [h for h in hosts if h.spec.node_name == real.name]
    result.host_pods_on_node = len(on_node)
    host = on_node[0]
    result.host = host.metadata.name
    model_pods = [
        p
        for p in cluster.core.list_namespaced_pod(NAMESPACE).items
        if p.spec.node_name == real.name and p.metadata.name not in {h.metadata.name for h in hosts}
    ]
    say(
        f"  the binder placed each replica and created one model host, {result.host}, on "
        f"{real.name} (beside {len(model_pods)} model pods there); its loader fetched and loaded "
        "all three through the agent, and each model's Service reaches it once loaded."
    )
    data = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    with httpclient.InferenceServerClient(f"{host.status.pod_ip}:9000") as http:
        for name, source in TRITONMODELS.items():
            if source == "add_one":
                tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
                tensor.set_data_from_numpy(data)
                answer = http.infer(name, [tensor]).as_numpy("OUTPUT0")
            else:
                flat = data[0]
                tensor = httpclient.InferInput("INPUT_FP32", list(flat.shape), "FP32")
                tensor.set_data_from_numpy(flat)
                answer = http.infer(name, [tensor]).as_numpy("OUTPUT_FP32")
            result.hosted[name] = [float(x) for x in answer.reshape(-1)]
            say(f"  REST {name} through {result.host}: {name}([1, 2, 3]) = {result.hosted[name]}")
    say(
        "  Three models cost one pod slot and one proxy here; as model pods they would take "
        "three of each."
    )
    for name in TRITONMODELS:
        custom.delete_namespaced_custom_object(
            "tritonshare.io", "v1alpha1", NAMESPACE, "tritonmodels", name
        )
    say("  Deleted them: the host drains and unloads them while the demo goes on.")


def _hosts_gone(cluster: SimCluster) -> bool:
    hosts = cluster.core.list_namespaced_pod(
        NAMESPACE, label_selector=f"{KEYS.prefix}model-host=true"
    )
    return not hosts.items


def _retire_short_form(cluster: SimCluster, result: DemoResult, say: Say) -> None:
    """Delete the short-form pods now that the demo is done with them: their proxies keep the
    webhook's production defaults (preStop 5 s, then a 5 s drain), so their graceful exit runs
    while the demo goes on rather than at its end."""
    done = [name for name in result.short_form if name in result.served]
    if not done:
        return
    say("")
    say(
        f"Deleting {', '.join(done)} now: its proxy keeps the webhook's production defaults "
        "(preStop 5 s, a 5 s drain, then the unload), which run while the demo goes on."
    )
    for name in done:
        with contextlib.suppress(ApiException):
            cluster.core.delete_namespaced_pod(name, NAMESPACE, _preload_content=False)


def _rollout(cluster: SimCluster, workdir: Path, result: DemoResult, say: Say) -> None:
    """A Deployment rolled to new model files on its one node while a client sends steadily;
    then deleted (its pods drain while the demo goes on)."""
    say("")
    say("A rollout to new model files, with Kubernetes' default strategy, on the model's one node:")
    result.rollout = rollout.roll(
        cluster, MODELS_DIR / "add_one", workdir / "rollout", NAMESPACE, say
    )
    rollout.retire(cluster, NAMESPACE)


def _autoscale(cluster: SimCluster, workdir: Path, result: DemoResult, say: Say) -> None:
    """KServe's concurrency experiment, short: a ScaledObject at target concurrency 1, three
    clients for 20 s, a real Prometheus scraping every second and the HPA syncing every two."""
    say("")
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        say("MISSING: prometheus (apt-get install prometheus); the autoscaling step is skipped.")
        return
    say("Autoscaling on concurrency (KEDA's ScaledObject, target 1 in flight per replica):")
    result.autoscale = autoscale.run(
        cluster,
        MODELS_DIR / "add_one",
        workdir / "autoscale",
        NAMESPACE,
        prometheus,
        clients=3,
        duration=20.0,
        max_replicas=3,
        sync_period=2.0,
        scrape_interval="1s",
        scale_down_window=5,
        settle=0.0,
        say=say,
    )
    scaled = result.autoscale
    for at, asked, ready in scaled.timeline:
        say(f"  {at:5.1f} s: {asked} replicas asked for, {ready} Ready")
    say(f"  {scaled.line()}")


def _overuse(cluster: SimCluster, result: DemoResult, say: Say) -> None:
    """A model that occupies more GPU memory than its pod asked for: the agent measures it, warns
    (or evicts, with --gpu-mem-enforcement=evict), and the binder counts what it really uses."""
    real, gateway = cluster.real_node, cluster.gateway
    if real is None or cluster.kubelet is None or gateway is None:
        return
    say("")
    say(f"A model that uses more GPU memory than it asked for: {GREEDY_POD.name} "
        f"({GREEDY_POD.story}).")  # fmt: skip
    manifest = model_pod_manifest(
        GREEDY_POD,
        PodPorts(free_port(), free_port(), free_port()),
        agent_port=int(cluster.agents[real.name].grpc.rpartition(":")[2]),
        gateway_http_port=gateway.http,
        gateway_grpc_port=gateway.grpc,
    )
    cluster.core.create_namespaced_pod(NAMESPACE, manifest, _preload_content=False)

    def warned() -> str:
        response = cluster.core.list_namespaced_event(
            NAMESPACE, field_selector=f"involvedObject.name={GREEDY_POD.name}",
            _preload_content=False,
        )  # fmt: skip
        for event in json.loads(response.data).get("items", []):
            if event.get("reason") == "GPUMemoryOverRequest":
                return str(event.get("message", ""))
        return ""

    result.overuse = wait_until("the agent's warning about the greedy model", warned, 120)

    pod = json.loads(
        cluster.core.read_namespaced_pod(GREEDY_POD.name, NAMESPACE, _preload_content=False).data
    )
    # The node publishes each model's figure by its name in Triton, private to its pod.
    name = private_triton_name(NAMESPACE, GREEDY_POD.model_id, pod["metadata"]["uid"])

    def measured() -> int:
        node = json.loads(cluster.core.read_node(real.name, _preload_content=False).data)
        usage = json.loads(node["metadata"].get("annotations", {}).get(KEYS.gpu_usage, "{}"))
        return max((g.get("models", {}).get(name, 0) for g in usage.values()), default=0)

    result.overuse_measured = wait_until("the measured memory on the node", measured, 60)
    say(f"  the agent measured it (NVML, around its load) and warned: {result.overuse}.")
    say(
        f"  The node now publishes {format_bytes(result.overuse_measured)} for it, and the binder "
        f"counts that, not the {GREEDY_POD.gpu_mem} it asked for, when it places the next pod on "
        f"that GPU."
    )
    say("  With --gpu-mem-enforcement=evict the agent would unload it and mark the pod Failed.")


def _metrics(cluster: SimCluster, ports: dict[str, PodPorts], result: DemoResult) -> None:
    leader = next((b for b in cluster.binders if b.identity == result.leader), None)
    sources = []
    if leader is not None:
        sources.append(leader.http)
    real = cluster.real_node
    if real is not None and real.name in cluster.agents:
        sources.append(cluster.agents[real.name].http)
    sources += [f"{_address(cluster, name)}:{ports[name].metrics}" for name in result.served]
    if cluster.triton is not None:
        # Triton's own per-model series, which the dashboard also reads.
        sources.append(f"127.0.0.1:{cluster.triton.metrics_port}")
    for address in sources:
        try:
            for key, value in scrape(address).items():
                result.metrics[key] = result.metrics.get(key, 0.0) + value
        except OSError:
            continue


def run_demo(workdir: Path, say: Say = print) -> DemoResult:
    """Run the whole scenario in `workdir`; returns what happened. Raises ClusterError if a part
    fails to come up or a pod fails, with the log to read."""
    started = time.monotonic()
    result = DemoResult()
    with SimCluster(workdir, NODES, binders=2, webhook=True, say=say) as cluster:
        result.missing = list(cluster.missing)
        for missing in cluster.missing:
            say(f"MISSING: {missing}; the demo runs without it.")
        result.leader = cluster.binder_leader()
        say("")
        say("Model pods, as a user (or KServe) writes them: schedulerName tritonshare, a GPU "
            "memory limit, a model id; or in the short form, two annotations the webhook "
            "completes:")  # fmt: skip
        for pod in PODS:
            say(f"  {pod.name:<11} {pod.gpu_mem:>5}  {pod.story}")
        ports = _create_pods(cluster, result, say)
        if cluster.binders:
            _wait_for_placement(cluster, result, say)
        else:
            say("No binder is running, so the model pods stay Pending; nothing more to show.")
        if result.placements and cluster.kubelet is not None:
            _wait_for_ready(cluster, result, say)
            say("Inferences through the proxies (tritonclient, REST and gRPC):")
            _infer(cluster, ports, result, say)
            _squat(cluster, result, say)
            _gateway(cluster, result, say)
            say("Inferences after the attempt: every model still answers as its owner's.")
            _infer(cluster, ports, result, say)
            # Printed where it is scraped: counters of processes the demo goes on to crash or
            # delete could not be scraped beside the closing table, and figures taken now would
            # contradict a table drawn later.
            _metrics(cluster, ports, result)
            summarize_metrics(result, say)
            _retire_short_form(cluster, result, say)
            _tritonmodels(cluster, result, say)
            _overuse(cluster, result, say)
            _rollout(cluster, workdir, result, say)
            _autoscale(cluster, workdir, result, say)
        _fail_over(cluster, result, say)
        retired = [name for name in result.short_form if name in result.served]
        # The closing table shows the cluster as it is: a pod whose drain is still running holds
        # its GPU memory until it is gone, as it would for kube-scheduler (the rolled and the
        # scaled Deployments' pods included, removed with their Deployments, and the model host
        # with its TritonModels).
        wait_until(
            f"{', '.join(retired) or 'the retired pods'} and the model host to be gone",
            lambda: (
                all(read_pod(cluster, name) is None for name in retired)
                and not any(
                    cluster.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
                    for selector in (rollout.SELECTOR, autoscale.SELECTOR)
                )
                and _hosts_gone(cluster)
            ),
            60,
        )
        if result.host:
            say("")
            say(
                f"The model host {result.host} drained, unloaded its models and was removed "
                "with its last TritonModel."
            )
        print_tables(cluster, result, say)
        say("")
        say("Deleting the model pods: each proxy drains, asks its agent to unload, and exits.")
        addresses = {
            p.name: str((read_pod(cluster, p.name) or {}).get("status", {}).get("podIP", ""))
            for p in PODS
            if p.name in result.served
        }
        for pod in ALL_PODS:
            with contextlib.suppress(ApiException):
                cluster.core.delete_namespaced_pod(pod.name, NAMESPACE, _preload_content=False)
        wait_until(
            "the model pods to be gone",
            lambda: all(read_pod(cluster, p.name) is None for p in ALL_PODS),
            90,
        )
        if cluster.gateway is not None and addresses:
            name, address = next(iter(addresses.items()))
            model = next(p.model_id for p in PODS if p.name == name)
            gateway = f"127.0.0.1:{cluster.gateway.http}"
            result.gateway_after_delete = _knock_from(address, gateway, model)
            say(f"  {name}'s address ({address}) at the gateway now: {result.gateway_after_delete}")
        result.loaded_after_shutdown = _loaded_models(cluster)
        say(
            "Triton has no model left loaded."
            if not result.loaded_after_shutdown
            else f"Still loaded in Triton: {result.loaded_after_shutdown}"
        )
        say("Stopping the binders, the agents, Triton and the API server.")
        cluster.stop_parts()
        result.exit_codes = dict(cluster.exit_codes)
        unclean = {part: code for part, code in result.exit_codes.items() if code != 0}
        crashed = {result.leader} if result.new_leader else set()
        if set(unclean) - crashed:
            say(f"Parts that did not stop cleanly (exit codes): {unclean}")
        assert cluster.apiserver is not None
        result.audit = cluster.apiserver.audit.snapshot()
    result.seconds = time.monotonic() - started
    return result


def _loaded_models(cluster: SimCluster) -> list[str]:
    return [name for name, state in cluster.triton_states().items() if state == "READY"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m sim.demo", description=__doc__
    )
    parser.add_argument("--workdir", type=Path, help="keep logs here (default: a temp dir)")
    parser.add_argument(
        "--real-gpu",
        action="store_true",
        help="run on this machine's GPUs and print the figures of a GPU check (sim.demo.gpucheck)",
    )
    parser.add_argument(
        "--burst",
        type=int,
        default=len(BURST),
        metavar="N",
        help=f"with --real-gpu: model pods created at once on one GPU after the single ones "
        f"(default {len(BURST)}; 0: none)",
    )
    parser.add_argument(
        "--parallel-loads",
        type=int,
        default=PARALLEL_LOADS,
        metavar="N",
        help=f"with --real-gpu: the agent's --parallel-loads and Triton's "
        f"--model-load-thread-count (default {PARALLEL_LOADS}, the chart's)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tritonshare-demo-"))

    def say(line: str) -> None:
        print(line, flush=True)

    if args.real_gpu:
        if args.burst < 0 or args.parallel_loads < 1:
            parser.error("--burst must be 0 or more and --parallel-loads 1 or more")
        return gpucheck.main(workdir, say, burst=args.burst, parallel_loads=args.parallel_loads)
    for line in INTRO:
        say(line)
    try:
        result = run_demo(workdir, say)
    except ClusterError as e:
        say(f"\nThe demo failed: {e}\nEvery process's log is in {workdir / 'logs'}.")
        return 1
    say("")
    if result.missing:
        say(f"Done in {result.seconds:.0f} s, WITHOUT: {'; '.join(result.missing)}.")
    else:
        say(f"Done in {result.seconds:.0f} s. Logs of every process: {workdir / 'logs'}")
    say("On a real GPU cluster the same parts deploy with deploy/ (see docs/deploy.md).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
