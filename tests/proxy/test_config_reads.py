"""When a proxy reads again the config of a model that says neither way whether its calls may
run twice (`proxy.table.ConfigReads`): Triton has no config for a sleeping model, so the reads
of one space out, doubling up to a bound, and one of its requests going to Triton makes it due
at once."""

from __future__ import annotations

from proxy.metrics import ProxyMetrics
from proxy.policy.limiter import Limiter
from proxy.table import ConfigReads, Entry, Served


def _served(model: str) -> Served:
    limiter = Limiter(0, 0, 1.0)
    return Served(model, limiter, ProxyMetrics(limiter, model), Entry(model))


def _rounds_read(reads: ConfigReads, served: Served, rounds: int) -> list[int]:
    """The rounds, of `rounds`, at which `served` is read, Triton having no config for it."""
    read = []
    for number in range(rounds):
        if reads.due(served):
            read.append(number)
            reads.missed(served)
    return read


def test_a_sleeping_models_reads_space_out_to_the_bound() -> None:
    reads = ConfigReads(most_rounds=8)
    assert _rounds_read(reads, _served("asleep"), 60) == [0, 2, 5, 10, 19, 28, 37, 46, 55]


def test_a_request_gone_to_triton_makes_its_model_due_at_once() -> None:
    reads, served = ConfigReads(most_rounds=32), _served("woken")
    _rounds_read(reads, served, 20)
    assert not reads.due(served)
    served.limiter.last += 1.0  # a request of it took a slot: the model is loaded again
    assert reads.due(served)


def test_a_read_config_or_a_new_entry_starts_again() -> None:
    reads, served = ConfigReads(most_rounds=32), _served("m")
    _rounds_read(reads, served, 20)
    assert not reads.due(served)
    assert reads.due(_served("m"))  # the table's new entry for the model
    reads.read(served)
    assert reads.due(served)
    _rounds_read(reads, served, 20)
    reads.keep(set())
    assert reads.due(served)
