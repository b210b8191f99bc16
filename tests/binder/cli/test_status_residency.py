"""`tritonshare status` per GPU: what is loaded (measured) and what sleeps (on-demand pods whose
model the node does not report loaded), beside what is placed."""

from __future__ import annotations

from binder.cli.report import residency_figures
from binder.cluster.objects import NodeInfo, pod_from_api
from common.contract import RESIDENCY_ON_DEMAND
from tests.binder.objects import GI, KEYS, pod_obj

ON_DEMAND = {KEYS.residency: RESIDENCY_ON_DEMAND}


def test_loaded_is_what_the_node_measures_and_sleeping_what_on_demand_pods_ask_unloaded() -> None:
    steady = pod_from_api(pod_obj("steady", mem="4Gi", node="n"), KEYS)
    awake = pod_from_api(pod_obj("awake", mem="2Gi", node="n", annotations=ON_DEMAND), KEYS)
    asleep = pod_from_api(pod_obj("asleep", mem="3Gi", node="n", annotations=ON_DEMAND), KEYS)
    node = NodeInfo("n", measured={steady.triton_name: 5 * GI, awake.triton_name: 2 * GI})
    assert residency_figures(node, [steady, awake, asleep]) == (7 * GI, 3 * GI)
    # An always pod not loaded yet is neither: its request stays placed (allocated) only.
    assert residency_figures(NodeInfo("n"), [steady]) == (0, 0)
