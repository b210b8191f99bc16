"""A TritonModel's GPU memory: declared, else the first estimate, else what its current files
measured plus the margin (binder.cluster.modelsizes), as its status says and its next replica is
booked (binder.cluster.modelviews)."""

from __future__ import annotations

from typing import Any

import pytest

from binder.cluster.modelsizes import (
    DECLARED,
    ESTIMATED,
    MEASURED,
    Booked,
    Sizing,
    booked_of,
    size_status,
)
from binder.cluster.modelviews import model_from_api
from common.contract import Keys

MI, GI = 1 << 20, 1 << 30
KEYS = Keys()
URI, NEW_URI = "s3://models/resnet", "s3://models/resnet-v2"
SIZING = Sizing(estimate=GI, margin_percent=10, margin_min=128 * MI)


@pytest.mark.parametrize(
    ("measured", "booked"),
    [
        (300 * MI, 428 * MI),  # the floor: 128Mi above
        (4 * GI, 4506 * MI),  # 10% above (409.6Mi), rounded up to a MiB
        (1280 * MI + 1, 1409 * MI),  # 10% (128Mi and a byte) above, rounded up
    ],
)
def test_a_measured_model_is_booked_at_the_larger_margin_rounded_up_to_a_mib(
    measured: int, booked: int
) -> None:
    assert SIZING.booking(measured) == booked
    assert Sizing(margin_min=0, least=512 * MI).booking(64 * MI) == 512 * MI


def test_the_next_replica_is_booked_declared_else_measured_for_these_files_else_estimated() -> None:
    learned = {"gpuMemory": {"source": MEASURED, "booked": "428Mi", "measured": "300Mi",
                             "storageUri": URI}}  # fmt: skip
    assert booked_of({"storageUri": URI, "gpuMemory": "2Gi"}, learned, GI) == Booked(
        DECLARED, "2Gi"
    )
    assert booked_of({"storageUri": URI}, learned, GI) == Booked(MEASURED, str(428 * MI))
    assert booked_of({"storageUri": URI}, {}, GI) == Booked(ESTIMATED, str(GI))
    # New files: learned again from the estimate.
    assert booked_of({"storageUri": NEW_URI}, learned, GI) == Booked(ESTIMATED, str(GI))
    # A status the binder cannot read is none.
    for broken in ("lots", None, 7):
        odd = {"gpuMemory": {**learned["gpuMemory"], "booked": broken}}
        assert booked_of({"storageUri": URI}, odd, GI) == Booked(ESTIMATED, str(GI))
    assert booked_of({"storageUri": URI}, {"gpuMemory": "428Mi"}, GI) == Booked(ESTIMATED, str(GI))


def test_the_status_says_the_estimate_then_what_was_measured_and_keeps_it_for_these_files() -> None:
    first = size_status(None, URI, {}, None, SIZING)
    assert first == {"source": ESTIMATED, "booked": "1Gi", "estimate": "1Gi"}
    measured = size_status(None, URI, {"gpuMemory": first}, 300 * MI, SIZING)
    assert measured == {
        "source": MEASURED, "booked": "428Mi", "estimate": "1Gi", "measured": "300Mi",
        "storageUri": URI,
    }  # fmt: skip
    # No replica loaded now (scaled to zero, asleep): what was measured is kept.
    assert size_status(None, URI, {"gpuMemory": measured}, None, SIZING) == measured
    # It grew: booked by what it measures now.
    grown = size_status(None, URI, {"gpuMemory": measured}, 4 * GI, SIZING)
    assert (grown["booked"], grown["measured"]) == ("4506Mi", "4Gi")
    # New files start from the estimate again.
    assert size_status(None, NEW_URI, {"gpuMemory": measured}, None, SIZING) == first
    # Declared: booked at it, and what it measured shown beside it.
    declared = size_status("2Gi", URI, {}, 300 * MI, SIZING)
    assert declared == {
        "source": DECLARED, "booked": "2Gi", "measured": "300Mi", "storageUri": URI
    }  # fmt: skip


def tritonmodel(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"uid": "u-1", "namespace": "team-a", "name": "resnet"},
        "spec": {"storageUri": URI, "replicas": 2, **spec},
        "status": status or {},
    }


def test_a_replica_of_a_model_without_gpu_memory_is_booked_by_what_it_measured() -> None:
    """Its template asks the estimate (plus the per-process allowance a model that may run in a
    process of its own is booked with), then what was measured plus the margin, the process's
    memory being in the figure: no allowance on top."""
    allowance = 640 * MI
    estimated = model_from_api(tritonmodel({}), KEYS, "tritonshare", allowance=allowance)
    assert not estimated.template.problem
    assert (estimated.size_source, estimated.template.request) == (ESTIMATED, GI + allowance)
    smaller = model_from_api(
        tritonmodel({}), KEYS, "tritonshare", allowance=allowance, estimate=256 * MI
    )
    assert smaller.template.request == 256 * MI + allowance
    status = {"gpuMemory": size_status(None, URI, {}, 300 * MI, SIZING)}
    measured = model_from_api(tritonmodel({}, status), KEYS, "tritonshare", allowance=allowance)
    assert (measured.size_source, measured.template.request) == (MEASURED, 428 * MI)
    assert (measured.template.allowance, measured.replica(1).request) == (0, 428 * MI)
    declared = model_from_api(
        tritonmodel({"gpuMemory": "2Gi"}, status), KEYS, "tritonshare", allowance=allowance
    )
    assert (declared.size_source, declared.template.request) == (DECLARED, 2 * GI + allowance)
