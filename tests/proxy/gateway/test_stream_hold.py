"""An open ModelStreamInfer stream obeys the probation hold and a suspect's trial, as a unary
request does: its next message waits out a hold, or is refused in the stream during a trial, and
reaches Triton only once the hold ends. Before, the slot an open stream keeps carried it to Triton
at once, during the load and settling window the hold keeps the node's exits apart for. Real
gateway and Triton; what reached Triton is read from the model's statistics."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from common.callers import Caller
from sim.triton import TritonServer
from tests.proxy.gateway.conftest import gateway_settings, publish, running_gateway
from tests.proxy.gateway.test_fair_share import tenant_of, wait_for
from tests.proxy.gateway.test_stream_flood import StreamFlood, infer_message, triton_successes

pytestmark = pytest.mark.triton

PROBATIONER = "127.1.0.61"


def test_an_open_streams_next_message_waits_out_a_hold_and_is_refused_in_a_trial(
    served_triton: TritonServer, tmp_path: Path
) -> None:
    table = tmp_path / "callers.json"
    probationer = Caller(PROBATIONER, "sleepy", "team-a/prober", "uid-a", probation=True)
    publish(table, probationer)
    with running_gateway(gateway_settings(served_triton, table)) as gateway:
        stream = StreamFlood(gateway.grpc_url, PROBATIONER)
        try:
            stream.send([infer_message(1, "r0")])
            assert not stream.answers(1)[0].error_message
            tenant = tenant_of(gateway, PROBATIONER)
            assert tenant is not None
            limiter = tenant.limiter
            at_triton = triton_successes(served_triton, "sleepy")

            publish(table, replace(probationer, held=True))
            wait_for(lambda: limiter.holding, "the hold")
            stream.send([infer_message(1, "r1")])
            wait_for(
                lambda: (
                    (limiter.held == 1 and not limiter.in_flight)
                    or triton_successes(served_triton, "sleepy") > at_triton
                ),
                "the message held (or sent on)",
            )
            assert triton_successes(served_triton, "sleepy") == at_triton, "at Triton, held"
            publish(table, probationer)
            answer = stream.answers(1)[0]
            assert not answer.error_message and answer.infer_response.id == "r1", answer
            assert triton_successes(served_triton, "sleepy") == at_triton + 1

            publish(table, replace(probationer, held=True, trial=True))
            wait_for(lambda: limiter._trial is not None, "the trial")
            stream.send([infer_message(1, "r2")])
            refused = stream.answers(1)[0]
            assert "under suspicion" in refused.error_message, refused
            assert refused.infer_response.id == "r2", refused
            assert triton_successes(served_triton, "sleepy") == at_triton + 1, "at Triton in trial"

            publish(table, probationer)
            wait_for(lambda: not limiter.holding, "the trial over")
            stream.send([infer_message(1, "r3")])
            answer = stream.answers(1)[0]
            assert not answer.error_message and answer.infer_response.id == "r3", answer
        finally:
            stream.close()
        wait_for(lambda: limiter.in_flight == 0, "every slot given back")
