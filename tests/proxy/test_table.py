"""A model host's proxy takes each model's own limit from the models file the host's loader
writes: `maxConcurrency` is that model's limiter's limit (absent: --container-concurrency), an
`on-demand` entry has its own residency (its `idleSeconds`, absent: --idle-seconds) until it
leaves, and a changed line retunes the model in place (its queue and metrics stay). No Triton is
needed: the table is read, nothing listens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from proxy.app import Proxy
from proxy.metrics import ProxyMetrics
from proxy.policy.limiter import Limiter
from proxy.residency import ASLEEP
from proxy.settings import parse_settings
from proxy.table import LEFT_SECONDS, Entry, ModelTable, Served, TableError, read_models


def _write(path: Path, entries: list[dict[str, object]]) -> None:
    partial = path.with_suffix(".new")
    partial.write_text(json.dumps(entries))
    partial.replace(path)


def _proxy(table: Path, *flags: str) -> Proxy:
    urls = ["--triton-http-url", "t:1", "--triton-grpc-url", "t:2"]
    return Proxy(parse_settings([*urls, "--models-file", str(table), *flags], env={}))


async def test_each_model_takes_its_own_limit_from_the_models_file(tmp_path: Path) -> None:
    table = tmp_path / "models.json"
    _write(
        table,
        [
            {"model": "small", "maxConcurrency": 3},
            {"model": "plain"},
            {"model": "sleepy", "maxConcurrency": 0, "idleSeconds": 60},
        ],
    )
    proxy = _proxy(table, "--container-concurrency", "2")
    assert proxy.table is not None
    proxy.table.reread(table)
    models = proxy.table.models
    limits = {name: (s.limiter.limit, s.limiter.queue_limit) for name, s in models.items()}
    assert limits == {"small": (3, 30), "plain": (2, 20), "sleepy": (2, 20)}
    assert models["sleepy"].entry == Entry("sleepy", 0, 60)
    small = models["small"]
    _write(table, [{"model": "small", "maxConcurrency": 5}, {"model": "plain"}])
    proxy.table.reread(table)
    assert proxy.table.models["small"] is small, "the same queue and metrics, retuned"
    assert (small.limiter.limit, small.limiter.queue_limit) == (5, 50)
    assert proxy.table.names == {"small", "plain"}
    # The model pod's own limiter is untouched by the table.
    assert proxy.limiter.limit == 2


async def test_each_on_demand_model_has_its_own_residency_until_it_leaves(tmp_path: Path) -> None:
    table = tmp_path / "models.json"
    _write(
        table,
        [
            {"model": "lazy", "residency": "on-demand", "idleSeconds": 7},
            {"model": "lazier", "residency": "on-demand"},
            {"model": "plain", "residency": "always"},
        ],
    )
    agent = ["--agent-address", "127.0.0.1:9", "--token-file", str(tmp_path / "token")]
    proxy = _proxy(table, *agent, "--idle-seconds", "60")
    assert proxy.table is not None
    proxy.table.reread(table)
    models, residencies = proxy.table.models, proxy.residencies.models
    assert {name: r.policy.idle_seconds for name, r in residencies.items()} == {
        "lazy": 7,
        "lazier": 60,
    }
    assert models["lazy"].limiter.residency is residencies["lazy"]
    assert models["plain"].limiter.residency is None
    residencies["lazy"]._set(ASLEEP)
    assert proxy.residencies.asleep("lazy") and not proxy.residencies.asleep("plain")
    assert not proxy.state.model_asleep, "a host's readiness asks about each model"
    assert b'model_state{model="lazy",state="idle-unloaded"} 1.0' in generate_latest(
        proxy.metrics.registry
    )
    lazy = residencies["lazy"]
    _write(table, [{"model": "lazy", "residency": "on-demand"}, {"model": "plain"}])
    proxy.table.reread(table)
    assert proxy.residencies.models["lazy"] is lazy, "the same residency, its idle time retuned"
    assert (lazy.policy.idle_seconds, lazy.policy.check_seconds) == (60, 15)
    _write(table, [{"model": "plain"}])
    proxy.table.reread(table)  # nothing in flight: removed at once
    assert proxy.residencies.models == {}
    assert b"lazy" not in generate_latest(proxy.metrics.registry)


async def test_an_explicit_queue_size_holds_for_every_model(tmp_path: Path) -> None:
    table = tmp_path / "models.json"
    _write(table, [{"model": "small", "maxConcurrency": 3}])
    proxy = _proxy(table, "--queue-size", "4")
    assert proxy.table is not None
    proxy.table.reread(table)
    limiter = proxy.table.models["small"].limiter
    assert (limiter.limit, limiter.queue_limit) == (3, 4)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"model": "a", "maxConcurrency": -1}, "`maxConcurrency` -1 is not a whole number"),
        ({"model": "a", "maxConcurrency": "4"}, "`maxConcurrency` '4' is not a whole number"),
        ({"model": "a", "idleSeconds": True}, "`idleSeconds` True is not a whole number"),
        ({"model": "a", "residency": "lazy"}, "`residency` 'lazy' is not one of always, on-demand"),
    ],
)
def test_a_bad_limit_says_which_entry(
    tmp_path: Path, entry: dict[str, object], message: str
) -> None:
    table = tmp_path / "models.json"
    _write(table, [{"model": "b"}, entry])
    with pytest.raises(TableError, match=f"entry 2 of the models file .*: {message}"):
        read_models(table)


async def test_a_host_starts_with_no_models_file_and_serves_it_once_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The host's proxy may start before its loader has made any model ready."""
    table = tmp_path / "models.json"
    proxy = _proxy(table)
    assert proxy.table is not None
    with caplog.at_level("INFO", logger="proxy.table"):
        proxy.table.reread(table)
        proxy.table.reread(table)
    assert proxy.table.names == set()
    assert [r.levelname for r in caplog.records if "No models file" in r.message] == ["INFO"]
    _write(table, [{"model": "small"}])
    proxy.table.reread(table)
    assert proxy.table.names == {"small"}


def test_an_entry_retired_in_flight_comes_back_under_its_new_private_name() -> None:
    """The node gateway's table of a host whose model moved to another replica (another
    private name) while a request is in flight: the old entry is retired at once (its request
    finishes on the entry it holds) and the model's next entry takes the new name."""
    names = {"m": "m-replica-0"}
    removed: list[str] = []

    def make(entry: Entry) -> Served:
        limiter = Limiter(4, 4, 1.0)
        return Served(entry.model, limiter, ProxyMetrics(limiter, entry.model), entry, names["m"])

    table = ModelTable(make, drain_seconds=30.0, on_remove=lambda s: removed.append(s.model_id))
    table.set_models([Entry("m")])
    old = table.models["m"]
    assert old.limiter.try_acquire()  # a request in flight
    table.set_models([])
    names["m"] = "m-replica-1"
    table.retire({"m"})
    table.set_models([Entry("m")])
    assert removed == ["m"] and table.models["m"] is not old
    assert table.private == {"m": "m-replica-1"}
    assert old.private == b"m-replica-0", "the request in flight keeps its replica"


def test_a_model_that_left_is_answered_retry_for_a_while_then_unknown() -> None:
    """A model leaving the table is in `left` (the routers answer it "retry") from the moment
    it leaves until `LEFT_SECONDS` later, or until it is back; the relays are told when it
    goes from there (their prepared answers for it go)."""
    now = [100.0]
    changes: list[int] = []

    def make(entry: Entry) -> Served:
        limiter = Limiter(4, 4, 1.0)
        return Served(entry.model, limiter, ProxyMetrics(limiter, entry.model), entry)

    table = ModelTable(make, drain_seconds=30.0, clock=lambda: now[0])
    table.on_change = lambda: changes.append(1)
    table.set_models([Entry("m"), Entry("n")])
    table.set_models([Entry("n")])
    assert "m" not in table.models, "drained at once: nothing in flight"
    assert table.left == {"m"} and table.left_encoded == {b"m"}
    now[0] += LEFT_SECONDS - 1
    changes.clear()
    table.sweep()
    assert table.left == {"m"} and not changes
    now[0] += 1
    table.sweep()
    assert table.left == set() and table.left_encoded == set() and changes == [1]
    table.set_models([Entry("n")])
    table.set_models([Entry("m"), Entry("n")])
    table.set_models([Entry("n")])
    table.set_models([Entry("m"), Entry("n")])
    assert table.left == set(), "back in the table: served, not 'retry'"
