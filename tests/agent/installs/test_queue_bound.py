"""The load's config override bounds how long a model's batchers keep a request or a sequence
(agent/installs/modelconfig.py `queue_bounded`): Triton's unload waits for them. The bound through
a real Triton and its unload is tests/agent/models/test_queue_bound.py."""

from __future__ import annotations

from agent.installs.modelconfig import ModelPolicy, parse_config, queue_bounded

SECOND = 1_000_000

HEADER = 'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'


def bounded(text: str, most: int = SECOND) -> tuple[str, list[str]]:
    config, lowered = queue_bounded(parse_config(HEADER + text, "m"), most)
    return str(config), lowered


def test_a_long_dynamic_batching_delay_and_queue_timeouts_are_lowered_to_the_bound() -> None:
    text, lowered = bounded(
        "dynamic_batching {\n"
        "  max_queue_delay_microseconds: 100000000\n"
        "  default_queue_policy { default_timeout_microseconds: 30000000 }\n"
        "  priority_levels: 2\n"
        "  priority_queue_policy { key: 1 value { default_timeout_microseconds: 5000000 } }\n"
        "  priority_queue_policy { key: 2 value { default_timeout_microseconds: 500 } }\n"
        "}\n"
    )
    assert lowered == [
        "dynamic_batching.max_queue_delay_microseconds: 100000000 -> 1000000",
        "dynamic_batching.default_queue_policy.default_timeout_microseconds: 30000000 -> 1000000",
        "dynamic_batching.priority_queue_policy[1].default_timeout_microseconds: 5000000 -> "
        "1000000",
    ]
    assert text.count("1000000") == 3 and "default_timeout_microseconds: 500\n" in text


def test_sequence_batching_idle_and_strategy_delay_are_lowered_and_triton_s_default_read() -> None:
    text, lowered = bounded(
        "sequence_batching {\n"
        "  max_sequence_idle_microseconds: 60000000\n"
        "  oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 9000000 }\n"
        "}\n"
    )
    assert lowered == [
        "sequence_batching.max_sequence_idle_microseconds: 60000000 -> 1000000",
        "sequence_batching.oldest.max_queue_delay_microseconds: 9000000 -> 1000000",
    ]
    assert "max_candidate_sequences: 4" in text, "the rest is kept"
    # 0 reads as Triton's default idle (1 s): lowered only under a bound below it.
    _, default = bounded("sequence_batching { direct { } }\n")
    assert default == []
    _, tighter = bounded("sequence_batching { direct { } }\n", SECOND // 2)
    assert tighter == ["sequence_batching.max_sequence_idle_microseconds: 1000000 -> 500000"]


def test_a_config_within_the_bound_or_without_batchers_is_unchanged() -> None:
    within = "dynamic_batching { max_queue_delay_microseconds: 100 }\n"
    config = parse_config(HEADER + within, "m")
    assert queue_bounded(config, SECOND) == (config, [])
    plain = parse_config(HEADER, "m")
    kept, lowered = queue_bounded(plain, SECOND)
    assert lowered == [] and kept == plain
    assert not kept.HasField("dynamic_batching") and not kept.HasField("sequence_batching")
    # No timeout (0) stays none: a request then waits only for its batch.
    zero = "dynamic_batching { default_queue_policy { default_timeout_microseconds: 0 } }\n"
    assert bounded(zero)[1] == []


def test_the_policy_s_default_bound_is_one_second() -> None:
    assert ModelPolicy().max_queue_microseconds == SECOND
