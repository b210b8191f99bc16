"""The residency benchmark on a small fleet: the same placement core and the same pods for every
configuration, a closing line with its figures, and fewer GPUs with the tail on-demand; the live
half's figures read from what it measured (its run on the simulated cluster is the benchmark's,
`python -m benchmarks.residency --quick`; the path it measures is tests/e2e/test_on_demand.py's)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from benchmarks import model_hosts, residency, residency_live, shapes


def test_a_small_fleet_needs_fewer_gpus_with_its_tail_on_demand(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["residency", "--quick", "--no-live", "--node-shape", "1xA100-80GB:96:110"]
    monkeypatch.setattr("sys.argv", argv)
    residency.main()
    out = capsys.readouterr().out
    assert "the on-demand tail (models outside the top 20% by rate) takes 5.00 % of requests" in out
    rows = dict(
        re.findall(r"^(all always \(baseline\)|tail on-demand, over-commit \d)\s+(\d+)", out, re.M)
    )
    always, factor_1, factor_3 = (int(rows[k]) for k in rows)
    # Without over-commit the tail still costs only its largest model beside the always ones.
    assert factor_3 < factor_1 <= always
    simulation, closing = out.strip().splitlines()[-2:]
    match = re.fullmatch(
        r"simulation: GPUs all-always (\d+), with the tail on-demand (\d+) \((\d+\.\d)x fewer\) "
        r"at over-commit 3; (\d+\.\d+) % of requests waited for a wake",
        simulation,
    )
    assert match is not None, simulation
    assert int(match[1]) == always and int(match[2]) == factor_3
    assert 0 < float(match[4]) <= 5.0  # only the tail's requests (5 %) can wait
    assert closing == (
        f"residency: GPUs all-always {always}, with the tail on-demand {factor_3} "
        f"({always / factor_3:.1f}x fewer); 1xA100-80GB:96:110 nodes as pods, bound by GPU "
        f"memory (all-always) and GPU memory (tail)"
    )


def _residency(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: Any) -> str:
    """The simulation of a small fleet (120 models in 5 namespaces, 6 minutes replayed)."""
    small = ["--models", "120", "--namespaces", "5", "--hours", "0.1", "--factors", "3"]
    monkeypatch.setattr("sys.argv", ["residency", "--no-live", *small, *argv])
    residency.main()
    out: str = capsys.readouterr().out
    return out.strip().splitlines()[-1]


CLOSING = re.compile(
    r"residency: GPUs all-always (\d+), with the tail on-demand (\d+) \(\d+\.\dx fewer\); "
    r"(\S+) nodes as (pods|tritonmodels), bound by (.+) \(all-always\) and (.+) \(tail\)"
)


def test_pods_bind_before_gpu_memory_where_the_node_has_few_slots_and_replicas_do_not(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shape = ["--node-shape", "8xA100-80GB:96:20"]
    as_pods = CLOSING.fullmatch(_residency(shape, monkeypatch, capsys))
    assert as_pods is not None
    assert as_pods.groups()[2:] == ("8xA100-80GB:96:20", "pods", "pods", "pods")
    assert int(as_pods[1]) == int(as_pods[2]) == 7 * 8, "120 pods: 7 nodes of 20 slots, 1 theirs"
    argv = [*shape, "--as", "tritonmodels"]
    as_replicas = CLOSING.fullmatch(_residency(argv, monkeypatch, capsys))
    assert as_replicas is not None, "5 namespaces: at most 5 hosts a node"
    assert as_replicas.groups()[3:] == ("tritonmodels", "nothing", "nothing")
    assert int(as_replicas[1]) == int(as_replicas[2]) == 8, "one node holds them all"


def test_cpu_binds_where_the_node_has_few_cpus_for_the_webhook_s_requests(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--node-shape", "8xA100-80GB:6:110"]
    closing = CLOSING.fullmatch(_residency(argv, monkeypatch, capsys))
    assert closing is not None and closing.groups()[4:] == ("CPU", "CPU")
    assert int(closing[1]) == 10 * 8, "6 CPUs less the node pod's 2.6: 13 pods of 250m a node"


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        ("8xA100:96", "is not GPUSxMODEL:CPUS:PODS; write GPUSxMODEL:CPUS:PODS, such as"),
        ("8xB200-192GB:96:110", "unknown GPU model 'B200-192GB'; use one of A100-80GB"),
        ("0xT4:4:29", "GPUs, CPUs and pods must each be at least 1"),
        ("1xT4:1:400", "leave no room for the node pod after kubelet's reservations for 400"),
        ("1xT4:1:29", "leave no room for the node pod after kubelet's reservations for 29"),
    ],
)
def test_a_bad_node_shape_is_refused_saying_what_to_write(
    shape: str, says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["residency", "--no-live", "--node-shape", shape])
    with pytest.raises(SystemExit) as exited:
        residency.main()
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert f"argument --node-shape: node shape {shape!r}" in error and says in error


TRITON_LOG = """\
I1125 10:00:21.633635 23948 model_lifecycle.cc:472] "loading: lazy_0-215b8cef:1"
I1125 10:00:26.250265 23948 model_lifecycle.cc:839] "successfully loaded 'lazy_0-215b8cef'"
I1125 10:00:39.274275 23948 model_lifecycle.cc:624] "successfully unloaded 'lazy_0-215b8cef' \
version 1"
I1125 10:00:44.500000 23948 model_lifecycle.cc:472] "loading: lazy_0-215b8cef:1"
I1125 10:00:44.600000 23948 model_lifecycle.cc:472] "loading: steady-9a8b7c6d:1"
I1125 10:00:45.750000 23948 model_lifecycle.cc:839] "successfully loaded 'lazy_0-215b8cef'"
I1125 10:00:46.000000 23948 model_lifecycle.cc:839] "successfully loaded 'steady-9a8b7c6d'"
"""


def test_the_live_half_reads_triton_s_own_wake_loads_and_its_percentiles() -> None:
    assert residency_live.triton_load_seconds(TRITON_LOG) == pytest.approx([1.25])
    starts = residency_live.load_starts(TRITON_LOG)
    assert [name for name, _ in starts] == ["lazy_0-215b8cef"] * 2, "the on-demand ones"
    sent = [("lazy_0", 10 * 3600 + 44.3), ("lazy_0", 10 * 3600 + 50.0)]
    delays = residency_live.before_load(sent, starts)
    assert delays == [pytest.approx(0.2)], "a wake with no load after it is left out"
    assert residency_live.percentile([0.5, 0.7, 0.9, 2.0], 0.5) == 0.7
    assert residency_live.percentile([0.5, 0.7, 0.9, 2.0], 0.99) == 2.0


def test_the_live_report_sets_the_always_p99_beside_its_own_alone() -> None:
    result = residency_live.LiveResult(
        wakes=[1.0, 1.2, 1.4], alone=[0.010] * 98 + [0.020] * 2, during=[0.010] * 98 + [0.030] * 2
    )
    lines: list[str] = []
    p50, p99, ratio = residency_live.report(result, lines.append)
    assert (p50, p99) == (1.2, 1.4) and ratio == pytest.approx(1.5)
    assert "(target p99 1.5 s: met)" in lines[0]
    assert "1.50x (target 1.2x: NOT met)" in lines[1]


def test_model_hosts_places_every_replica_with_one_host_per_namespace_and_node(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["model_hosts", "--models", "40", "--namespaces", "3", "--nodes", "4"]
    argv += ["--unplaceable", "200", "--scale-bomb", str(10**9)]
    monkeypatch.setattr("sys.argv", [*argv, "--node-shape", "8xL4:32:4"])
    model_hosts.main()
    out = capsys.readouterr().out
    placed = re.search(r"^placed (\d+), refused (\d+); on (\d+) nodes: (\d+) hosts", out, re.M)
    assert placed is not None, out
    assert (int(placed[1]), int(placed[2])) == (80, 0)
    nodes, hosts = int(placed[3]), int(placed[4])
    # 80 replicas of 0.5-16 GiB fill more than one node of 8 L4s; a host per namespace on each.
    assert 1 < nodes <= 4 and hosts == 3 * nodes
    assert re.search(r"^model_hosts: [\d,]+ replicas/s, \d+\.\d{3} ms of binder CPU", out, re.M)
    # Beside a namespace of unplaceable models and a scale bomb, through the model turns.
    attacked = re.search(
        r"^model_hosts under attack: .* \((\d+) of 80 placed; (\d+) attacking", out, re.M
    )
    assert attacked is not None, out
    assert int(attacked[2]) <= 40, "the attacker's namespace takes its turns, not more"
    newcomer = re.search(r"placed in [\d.]+ ms \((\d+) attacking turns? first\)", out)
    assert newcomer is not None and int(newcomer[1]) <= 1, out


def test_the_placement_is_held_to_the_lower_bound_of_whole_nodes_memory_and_pod_slots() -> None:
    gib = 1024**3
    one = shapes.parse_shape("1xA100-80GB:96:110")
    eight = shapes.parse_shape("8xA100-80GB:96:110")
    full = [int(79.5 * gib)] * 9
    assert residency.lower_bound(full, one, "tritonmodels") == 9
    assert residency.lower_bound(full, eight, "tritonmodels") == 16, "whole nodes"
    tiny = [gib // 2] * 300
    assert residency.lower_bound(tiny, eight, "tritonmodels") == 8
    assert residency.lower_bound(tiny, eight, "pods") == 24, "109 pod slots a node"
    assert residency.check_placement(112, 112) == [True]
    assert residency.check_placement(152, 112) == [False]
