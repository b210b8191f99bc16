"""The proxy's isolation table (docs/proxy.md, tests/proxy/test_isolation.py) run against the
gateway: the same tests, with the gateway where the proxy was.

The test clients connect from 127.0.0.1, so the caller table names 127.0.0.1 as the pod that owns
add_one (the agent never writes the node's own address, see tests/agent/pods/test_gateway_table.py;
the gateway takes the table as it is). Every row must hold exactly as it does for the proxy: the
gateway runs the proxy's relays, bound to the caller's model.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.triton import TritonServer
from tests.proxy.gateway.conftest import (
    RunningGateway,
    caller,
    gateway_settings,
    publish,
    running_gateway,
)
from tests.proxy.test_isolation import (  # noqa: F401 - collected here against the gateway
    test_adversarial_paths_get_the_same_answer_as_from_triton,
    test_another_model_is_answered_as_triton_answers_an_unknown_one,
    test_grpc_another_model_is_answered_as_triton_answers_an_unknown_one,
    test_grpc_duplicated_name_cannot_smuggle_another_model,
    test_grpc_infer_for_another_model_matches_triton,
    test_grpc_platform_apis_are_refused,
    test_grpc_unknown_methods_and_services_are_unimplemented,
    test_own_model_routes_answer_as_triton_does,
    test_platform_apis_are_refused_and_never_reach_triton,
    test_statistics_of_all_models_are_narrowed,
    test_unknown_routes_are_not_found,
)

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def module_table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gateway") / "callers.json"
    publish(path, caller("127.0.0.1", "add_one"))
    return path


@pytest.fixture(scope="module")
def proxy(served_triton: TritonServer, module_table: Path) -> Iterator[RunningGateway]:
    """The gateway, in the place the isolation tests give the proxy."""
    # The table is written once for the module: it must not go stale while the rows run.
    settings = gateway_settings(served_triton, module_table, table_max_age_seconds=3600)
    with running_gateway(settings) as running:
        yield running
