"""The proxy's isolation table (docs/proxy.md, tests/proxy/test_isolation.py) run against the
gateway: the same tests, with the gateway where the proxy was, in two networks.

By address: the test clients connect from 127.0.0.1, so the caller table names 127.0.0.1 as the
pod that owns add_one (the agent never writes the node's own address, see
tests/agent/pods/test_gateway_table.py; the gateway takes the table as it is). Masquerading: the
pod's address in the table is another (127.1.0.99), its proxy's connections arrive from the
node's address (127.0.0.1, as a CNI's SNAT makes them) and name the pod by its caller key; the
clients reach the gateway through that proxy. Every row must hold exactly as it does for the
proxy: the gateway runs the proxy's relays, bound to the caller's model.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import replace

import pytest

from common.callerkeys import digest, preamble
from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy
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


KEY = secrets.token_bytes(32)


@pytest.fixture(scope="module", params=["by-address", "masquerading"])
def proxy(
    request: pytest.FixtureRequest,
    served_triton: TritonServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningGateway | RunningProxy]:
    """The gateway, in the place the isolation tests give the proxy; masquerading, the pod's
    proxy in front of it."""
    table = tmp_path_factory.mktemp("gateway") / "callers.json"
    if request.param == "by-address":
        publish(table, caller("127.0.0.1", "add_one"))
    else:
        publish(table, replace(caller("127.1.0.99", "add_one"), key=digest(KEY)))
    # The table is written once for the module: it must not go stale while the rows run.
    settings = gateway_settings(
        served_triton,
        table,
        table_max_age_seconds=3600,
        caller_identity="key-or-address" if request.param == "by-address" else "key",
    )
    with running_gateway(settings) as gateway:
        if request.param == "by-address":
            yield gateway
            return
        through = proxy_settings(
            served_triton,
            triton_http_url=gateway.http_url,
            triton_grpc_url=gateway.grpc_url,
            source_address="127.0.0.1",
            grpc_mode="relay",
        )
        with running_proxy(through) as pod:
            pod.proxy.state.caller_key = preamble(KEY)
            yield pod
