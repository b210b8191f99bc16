"""The eviction rule (agent/models/eviction.py): which idle on-demand models a GPU gives up for a
load, in which order, which used ones a namespace past its share gives back, and what the loading
namespace is told when none may be."""

from __future__ import annotations

from agent.models.eviction import Gpu, Loaded, choose

GI = 1024**3
NOW = 1000.0
GPU = Gpu("GPU 0 (GPU-a)", 16 * GI)


def od(
    name: str,
    namespace: str,
    size: int = 2 * GI,
    idle: float = 60.0,
    *,
    busy: bool = False,
    in_flight: int = 0,
) -> Loaded:
    """An on-demand model loaded, last used `idle` seconds ago."""
    return Loaded(name, namespace, f"id-{name}", size, True, busy, in_flight, NOW - idle)


def always(name: str, namespace: str, size: int) -> Loaded:
    return Loaded(name, namespace, f"id-{name}", size, False, last_used=0.0)


def names(held: list[Loaded], namespace: str, needed: int, min_idle: float = 2.0) -> list[str]:
    choice = choose(GPU, held, namespace, needed, NOW, min_idle)
    assert not choice.problem, choice.problem
    return [v.name for v in choice.victims]


def test_nothing_is_evicted_when_nothing_is_needed() -> None:
    assert names([od("a", "x")], "x", 0) == []


def test_never_always_busy_serving_or_recent_models() -> None:
    held = [
        always("steady", "y", 4 * GI),
        od("busy", "y", busy=True),
        od("serving", "y", in_flight=1),
        od("recent", "y", idle=1.0),
        od("idle", "y", idle=3.0),
    ]
    assert names(held, "x", GI) == ["idle"]
    choice = choose(GPU, held, "x", 3 * GI, NOW, 2.0)
    assert choice.victims == () and "GPU 0 (GPU-a)" in choice.problem
    assert "1Gi more are needed" in choice.problem


def test_the_loading_namespace_gives_up_its_own_idle_models_first_lru_first() -> None:
    held = [od("theirs-old", "y", idle=600), od("mine-new", "x", idle=10), od("mine-old", "x")]
    assert names(held, "x", 3 * GI) == ["mine-old", "mine-new"]
    assert names(held, "x", 5 * GI) == ["mine-old", "mine-new", "theirs-old"]


def test_namespaces_over_their_fair_share_go_before_those_within_it() -> None:
    # 16Gi of on-demand room, three namespaces (x loads): a share is 5.33Gi. y holds 8Gi (over),
    # z 2Gi (within, and least recently used of all).
    held = [od("z1", "z", idle=900), od("y1", "y", 4 * GI, idle=60), od("y2", "y", 4 * GI, idle=30)]
    assert names(held, "x", 2 * GI) == ["y1"]
    # Once y is within its share again, plain LRU among all.
    assert names(held, "x", 6 * GI) == ["y1", "z1"]


def test_always_models_shrink_the_room_the_shares_are_made_of() -> None:
    # 16Gi less 10Gi always: 6Gi of room for x and y, 3Gi each. y holds 4Gi: over its share.
    held = [always("a", "w", 10 * GI), od("z1", "z", GI, idle=900), od("y1", "y", 4 * GI)]
    assert names(held, "x", GI) == ["y1"]


def test_a_stale_activity_table_evicts_nothing_and_names_only_the_callers_models() -> None:
    held = [od("theirs", "y"), od("mine", "x")]
    choice = choose(GPU, held, "x", GI, NOW, 2.0, activity_problem="the table is 9 s old")
    assert choice.victims == ()
    assert "the table is 9 s old" in choice.problem
    assert "id-mine" in choice.problem and "id-theirs" not in choice.problem


def test_all_or_nothing() -> None:
    held = [od("a", "y", GI), od("b", "y", GI, in_flight=2)]
    choice = choose(GPU, held, "x", 2 * GI, NOW, 2.0)
    assert choice.victims == () and choice.problem
    assert "id-a" not in choice.problem and "id-b" not in choice.problem


def test_a_namespace_over_its_share_cannot_take_from_one_within_its_share() -> None:
    # 16Gi of room, x and z: 8Gi each. x holds 6Gi, all serving; z holds 2Gi, idle for long.
    held = [od("x1", "x", 6 * GI, in_flight=1), od("z1", "z", 2 * GI, idle=900)]
    # An on-demand wake of 4Gi would take x to 10Gi, past its 8Gi: z's model stays.
    choice = choose(GPU, held, "x", 2 * GI, NOW, 2.0, claim=4 * GI)
    assert choice.victims == ()
    assert "8Gi each" in choice.problem and "id-z1" not in choice.problem
    # A wake that keeps x within its share may take z's idle model; so may an always load.
    assert [v.name for v in choose(GPU, held, "x", GI, NOW, 2.0, claim=GI).victims] == ["z1"]
    assert [v.name for v in choose(GPU, held, "x", 2 * GI, NOW, 2.0).victims] == ["z1"]


def test_a_trickle_keeps_no_model_past_its_namespaces_share_from_one_within_its_own() -> None:
    """y keeps both its models used (one request each every half second, one a slow request in
    flight) and holds 12 GiB of the GPU's 16; x, within its share with its wake, takes back what
    y holds past its share, least recently used first, and no more."""
    held = [
        od("y1", "y", 6 * GI, idle=0.4, in_flight=1),
        od("y2", "y", 6 * GI, idle=0.2),
        od("x-busy", "x", 2 * GI, busy=True),
    ]
    choice = choose(GPU, held, "x", 4 * GI, NOW, 30.0, claim=4 * GI)
    assert [v.name for v in choice.victims] == ["y1"] and not choice.problem
    assert choice.reclaimed == {"y1"}
    # y within its share after one (6 of 8 GiB): its other model stays, the load fails.
    short = choose(GPU, held, "x", 8 * GI, NOW, 30.0, claim=4 * GI)
    assert short.victims == () and short.problem


def test_a_namespace_past_its_share_takes_nothing_back_and_busy_models_stay() -> None:
    held = [od("x1", "x", 6 * GI, idle=0.2), od("y-busy", "y", 6 * GI, busy=True)]
    over = choose(GPU, held, "y", 6 * GI, NOW, 30.0, claim=6 * GI)
    assert over.victims == (), "y would pass its share: x's used model is not taken"
    assert over.problem
    held = [od("y1", "y", 12 * GI, busy=True)]
    assert choose(GPU, held, "x", 4 * GI, NOW, 30.0, claim=4 * GI).victims == ()
