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
from tests.proxy.gateway.test_fair_share import post, sleepy, tenant_of, wait_for
from tests.proxy.gateway.test_stream_flood import StreamFlood, infer_message, triton_successes

pytestmark = pytest.mark.triton

PROBATIONER = "127.1.0.61"
NEIGHBOUR = "127.1.0.62"
SLEEPY = "/v2/models/sleepy/infer"


def counted(triton: TritonServer, requests: int) -> None:
    """Wait until Triton's statistics count `requests` of sleepy's (they lag its answers)."""
    wait_for(lambda: triton_successes(triton, "sleepy") >= requests, f"{requests} counted")
    assert triton_successes(triton, "sleepy") == requests


def test_an_open_streams_next_message_waits_out_a_hold_and_is_refused_in_a_trial(
    served_triton: TritonServer, tmp_path: Path
) -> None:
    table = tmp_path / "callers.json"
    probationer = Caller(PROBATIONER, "sleepy", "team-a/prober", "uid-a", probation=True)
    publish(table, probationer)
    with running_gateway(gateway_settings(served_triton, table)) as gateway:
        stream = StreamFlood(gateway.grpc_url, PROBATIONER)
        try:
            at_triton = triton_successes(served_triton, "sleepy") + 1
            stream.send([infer_message(1, "r0")])
            assert not stream.answers(1)[0].error_message
            tenant = tenant_of(gateway, PROBATIONER)
            assert tenant is not None
            limiter = tenant.limiter
            counted(served_triton, at_triton)

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
            counted(served_triton, at_triton + 1)

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


def test_an_idle_open_stream_does_not_hold_the_probation_lane(
    served_triton: TritonServer, tmp_path: Path
) -> None:
    """A probationer's open stream keeps no slot while none of its messages is at Triton, so its
    turn on the lane ends with its requests: another probationer is answered while the stream
    stays open (and open with nothing sent yet, or open with its slot since before its
    probation), and the stream's next message takes a turn."""
    table = tmp_path / "callers.json"
    pods = (
        Caller(PROBATIONER, "sleepy", "team-a/prober", "uid-a"),
        Caller(NEIGHBOUR, "sleepy", "team-b/neighbour", "uid-b"),
    )
    publish(table, *pods)
    with running_gateway(gateway_settings(served_triton, table)) as gateway:
        before = StreamFlood(gateway.grpc_url, PROBATIONER)  # its slot kept since before
        before.send([infer_message(1, "b0")])
        assert not before.answers(1)[0].error_message
        publish(table, *(replace(pod, probation=True) for pod in pods))
        tenant = tenant_of(gateway, PROBATIONER)
        assert tenant is not None
        wait_for(lambda: tenant.limiter.probation is not None, "probation")
        idle = StreamFlood(gateway.grpc_url, PROBATIONER)
        stream = StreamFlood(gateway.grpc_url, PROBATIONER)
        try:
            stream.send([infer_message(1, "r0")])
            assert not stream.answers(1)[0].error_message
            for _ in range(2):
                status, body = post(gateway.http_url, NEIGHBOUR, SLEEPY, sleepy(1))
                assert status == 200, body
            stream.send([infer_message(1, "r1")])
            answer = stream.answers(1)[0]
            assert not answer.error_message and answer.infer_response.id == "r1", answer
        finally:
            for flood in (stream, idle, before):
                flood.close()
