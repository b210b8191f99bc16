"""The demo's scenario, end to end, with assertions: every part as a real process against sim/,
a real Triton on the CPU, tritonclient through the proxies, and a clean shutdown."""

from __future__ import annotations

import pytest

from sim.demo import autoscale, rollout
from sim.demo.report import DemoResult
from sim.demo.scenario import GREEDY_POD, LATE_POD, NODES, PODS


@pytest.mark.slow
@pytest.mark.triton
def test_the_demo_scenario_places_serves_explains_and_cleans_up(
    demo_run: tuple[DemoResult, str],
) -> None:
    result, transcript = demo_run

    assert result.missing == [], transcript
    assert result.leader in {"binder-0", "binder-1"}

    # Placement follows the users' selectors, tolerations and affinity, and packs GPUs.
    node_of = {pod: node for pod, (node, _) in result.placements.items()}
    gpu_of = {pod: gpu for pod, (_, gpu) in result.placements.items()}
    assert node_of["add-one"] == node_of["identity"] == "t4-node-0"
    assert gpu_of["add-one"] == gpu_of["identity"], "binpack keeps both small models on one GPU"
    assert {node_of["ranker"], node_of["llm-70b"]} == {"a100-node-0", "a100-node-1"}
    tainted = {n.name for n in NODES if n.taints}
    assert node_of["embeddings"] not in tainted
    assert all(gpu.startswith("GPU-") for gpu in gpu_of.values())

    # What cannot be placed is explained as kube-scheduler would, on the pod itself.
    unfit = {p.name for p in PODS if not p.fits}
    assert set(result.pending) == unfit
    assert "GPU memory" in result.pending["llm-405b"]
    assert "didn't match Pod's node affinity/selector" in result.pending["h100-only"]
    assert result.pending["h100-only"].startswith(f"0/{len(NODES)} nodes are available")

    # identity was written in the short form (a model URI and its GPU memory) and completed by
    # tritonshare's webhook on its way into the API server; it was then placed, fetched from the
    # model store by the storage initializer, loaded and served like the others (below).
    assert set(result.short_form) == {p.name for p in PODS if p.short_form} == {"identity"}
    made = result.short_form["identity"]
    assert made["schedulerName"] == "tritonshare"
    assert made["annotations"]["tritonshare.io/model-id"] == "identity"
    assert made["annotations"]["tritonshare.io/gpu-mem"] == "3Gi"
    initializer, loader = made["initContainers"]
    assert initializer["image"].startswith("kserve/storage-initializer:")
    uri = made["annotations"]["tritonshare.io/model-uri"]
    assert uri.startswith("https://127.0.0.1:") and uri.endswith("/identity.tar.gz")
    assert initializer["args"] == [uri, "/mnt/models"]
    assert loader["name"] == "loader" and made["containers"] == ["proxy"]

    # The binder's CLI explains a pending pod node by node.
    for node in NODES:
        assert node.name in result.explain
    # The pods on the node with Triton really ran: loaded, ready, answering through the proxy.
    on_real = {p for p, n in node_of.items() if n == "t4-node-0"}
    assert set(result.served) == on_real
    assert result.inferences["add-one"] == [2.0, 3.0, 4.0]
    assert result.inferences["identity"] == [1.0, 2.0, 3.0]
    assert result.isolation_refused, "a proxy must refuse another pod's model"
    # A pod created with spec.nodeName and another team's model id is refused by the agent,
    # with an Event on it, and the owner's model still answers (checked after the attempt).
    assert "not placed on this node by the tritonshare binder" in result.squatter_refused
    # Every pod reaches Triton only through the node's gateway (the proxies' inferences above went
    # that way): a pod that is no model pod is refused at accept, whatever its labels, and a
    # model pod asking for its neighbour's model is answered as for a model Triton lacks.
    assert "refused" in result.gateway_stranger and "127.1." in result.gateway_stranger
    assert result.gateway_neighbour.startswith("HTTP/1.1 400"), result.gateway_neighbour
    # A deleted pod's address reaches nothing once the pod is gone.
    assert "refused" in result.gateway_after_delete, result.gateway_after_delete
    # A model using more GPU memory than its pod asked for is measured, warned about, and the
    # node publishes what it uses (the binder's accounting reads it).
    assert "uses 14.5Gi of GPU memory" in result.overuse
    assert "more than the 13.5Gi its pod requested" in result.overuse
    assert result.overuse_measured == 29 * 1024**3 // 2

    # A crashed leader is replaced: the follower takes the lease and binds a pod created after.
    assert result.new_leader in {"binder-0", "binder-1"} - {result.leader}
    assert node_of[LATE_POD.name] in {"a100-node-0", "a100-node-1"}
    assert result.failover_seconds < 60

    # Metrics as the parts export them (scraped before the crash).
    scheduled = "tritonshare_binder_schedule_attempts_total{result=scheduled}"
    assert result.metrics[scheduled] == len([p for p in PODS if p.fits])
    assert result.metrics["tritonshare_agent_models_loaded"] == len(on_real)

    # Every part stopped cleanly on SIGTERM (the crashed leader was already dead).
    expected = {f"agent/{n.name}" for n in NODES} | {
        "binder-0",
        "binder-1",
        "gateway/t4-node-0",
        "webhook",
    }
    assert set(result.exit_codes) == expected
    assert {part: code for part, code in result.exit_codes.items() if code != 0} == {
        result.leader: -9
    }

    # Deleting the pods drained the proxies, which had the agent unload every model.
    assert result.loaded_after_shutdown == []
    assert "Triton has no model left loaded." in transcript

    # The model Deployment scaled out on concurrency and back, through a real Prometheus and the
    # simulated KEDA and HPA: every new replica placed, loaded and answering, no request failed
    # while it scaled up, nor while it scaled back to one (the removed pods drained).
    scaled = result.autoscale
    assert scaled is not None, "prometheus is installed in CI: the autoscaling step must run"
    assert scaled.peak_ready == 3, (scaled.timeline, scaled.hpa_status)
    assert scaled.failed == [], scaled.failed[:5]
    assert scaled.scaled_down_to == 1, scaled.timeline
    assert scaled.scale_down_failed == [], scaled.scale_down_failed[:5]
    assert scaled.scale_down_requests > 0
    assert len(scaled.cold_starts) >= 2
    for phases in scaled.cold_starts:
        assert set(phases) == set(autoscale.PHASES), phases
        assert phases["bound"] <= phases["loaded"] <= phases["ready"] <= phases["first answer"]
    assert "autoscale: target 1, concurrency 3 -> 3 replicas Ready" in transcript


@pytest.mark.slow
@pytest.mark.triton
def test_the_demos_closing_table_is_the_clis_and_agrees_with_the_api(
    demo_run: tuple[DemoResult, str],
) -> None:
    """The closing table is what `tritonshare status` prints, and what it says is what the API
    server holds at that moment: every bound, live pod on its node and GPU, no pod the demo
    deleted, and each GPU's allocation the sum of what its pods hold."""
    result, transcript = demo_run
    assert result.status_text.strip(), transcript
    for line in result.status_text.splitlines():
        assert f"  {line}".rstrip() in transcript

    live = [p for p in result.pods_in_api if p["phase"] not in {"Succeeded", "Failed"}]
    expected = {(p["node"], p["gpu"], p["pod"], p["request"]) for p in live if p["node"]}
    shown = {
        (node["name"], gpu["uuid"], pod["pod"], pod["request"])
        for node in result.status["nodes"]
        for gpu in node["gpus"]
        for pod in gpu["pods"]
    }
    assert shown == expected
    assert {node["name"] for node in result.status["nodes"]} == {n.name for n in NODES}
    assert sorted(result.status["pending"]) == sorted(f"models/{n}" for n in result.pending)

    # The demo deleted the short-form pod before the table, and created greedy and the failover's
    # pod after the first placements: the table follows the cluster, not the demo's script.
    names = {pod.rpartition("/")[2] for _, _, pod, _ in shown}
    assert "identity" not in names
    assert {GREEDY_POD.name, LATE_POD.name} <= names

    for node in result.status["nodes"]:
        for gpu in node["gpus"]:
            for pod in gpu["pods"]:
                assert pod["holds"] == max(pod["request"], pod["measured"] or 0)
            assert gpu["allocated"] == sum(p["holds"] for p in gpu["pods"])
            assert 0 <= gpu["free"] <= gpu["capacity"] - gpu["allocated"]
    greedy = next(
        pod
        for node in result.status["nodes"]
        for gpu in node["gpus"]
        for pod in gpu["pods"]
        if pod["pod"] == f"models/{GREEDY_POD.name}"
    )
    assert greedy["measured"] == result.overuse_measured == 29 * 1024**3 // 2


@pytest.mark.slow
@pytest.mark.triton
def test_the_demos_metrics_are_printed_where_they_are_scraped(
    demo_run: tuple[DemoResult, str],
) -> None:
    """The metrics summary is taken after the first inferences, before the demo deletes, crashes
    and creates pods: it is printed there, never beside the closing table it would contradict."""
    result, transcript = demo_run
    lines = transcript.splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("Metrics at this point"))
    table = next(i for i, line in enumerate(lines) if line.startswith("Nodes, GPUs and the models"))
    crash = next(i for i, line in enumerate(lines) if line.startswith("Crashing the leader binder"))
    assert heading < crash < table
    summary: dict[str, str] = {}
    for line in lines[heading + 1 :]:
        if not line.startswith("  "):
            break
        label, _, value = line.strip().rpartition(" ")
        summary[label.strip()] = value
    # What the figures say holds at the moment they were scraped.
    assert summary["binder: pods pending now"] == str(len(result.pending))
    on_real = [pod for pod, (node, _) in result.placements.items() if node == "t4-node-0"]
    assert summary["agent: models loaded"] == str(len(on_real))


@pytest.mark.slow
@pytest.mark.triton
def test_the_demos_tritonmodels_are_served_by_one_model_host(
    demo_run: tuple[DemoResult, str],
) -> None:
    """Three TritonModels of the demo's namespace on the real node: one host serves them all,
    each with its own files (add_one adds 1; identity echoes), then leaves with them."""
    result, transcript = demo_run
    assert result.host_pods_on_node == 1, transcript
    assert result.host.startswith("tritonshare-host-")
    assert result.hosted == {
        "tm-add-one": [2.0, 3.0, 4.0],
        "tm-add-two": [2.0, 3.0, 4.0],
        "tm-identity": [1.0, 2.0, 3.0],
    }, transcript
    assert "was removed with its last TritonModel" in transcript


@pytest.mark.slow
@pytest.mark.triton
def test_the_demos_deployment_rolls_to_new_model_files_with_no_failed_request(
    demo_run: tuple[DemoResult, str],
) -> None:
    """The rollout step (`sim.demo.rollout`): the Deployment (Kubernetes' default strategy:
    surge 25% of 1 rounds up to 1, unavailable rounds down to 0) has as many replicas as nodes
    that can take its model, one. Its template is the short form tritonshare's webhook
    completes; the release changes the model URI annotation to other files of the same model id.
    The controller manager creates the new revision's pod beside the old one, the binder places
    it on the same node (another revision), the agent loads it, and the old pod goes once the new
    one is available. A client sends steadily through the ready endpoints all along: no request
    may fail, and the answers move from the old files' to the new files'."""
    result, transcript = demo_run
    rolled = result.rollout
    assert rolled is not None, transcript
    # The surge pod, a new revision, joined the old one on the only node it may run on.
    real = next(node.name for node in NODES if node.real)
    assert rolled.surge_node == rolled.old_node == real
    assert rolled.stuck == "", rolled.stuck
    assert rolled.finished
    assert rolled.failures == [], rolled.failures[:5]
    assert rolled.answers == [str(rollout.OLD_ANSWER), str(rollout.NEW_ANSWER)]
    assert rolled.answers_after == [str(rollout.NEW_ANSWER)]
    assert rolled.requests >= 30
