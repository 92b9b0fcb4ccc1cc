"""The Redis record format: round trips, the same random stream after, and clear refusals.

`GOLDEN` (format 1) was written by the release before the codec moved here, and before the
budget guard: records already in Redis must still decode. `GOLDEN_V2` pins format 2, which adds
the guard's flag, newest action and counts; format 3 adds the shield's count (`GOLDEN_V3`), format
4 the episode's cut floor (`GOLDEN_V4`), format 5 the newest step's reward and cost.
"""

from __future__ import annotations

import math
import struct
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from runtime.budget_guard import GuardAction, GuardTally
from runtime.card import ModelCard
from runtime.context import EpisodeContext
from service.episode_state import EpisodeRecord, act, advance, next_revision, open_episode, rebudget
from service.errors import RecordFormatError
from service.schemas import BudgetUpdate, EpisodeCreate, StepRequest
from service.stores.codec import (
    CONTEXT_FORMAT,
    RECORD_FORMAT,
    decode_context,
    decode_record,
    encode_context,
    encode_record,
)

GOLDEN = bytes.fromhex(
    "01000700000000000000040000000000000000002040fc54d94100005040fc54d941020065310300746f7901"
    "0032040061623132010300000003000000020000000300000000000000000049400000000000002040000000"
    "0000001840000000000000f83ffec283450d9f596a09f0b33e6807df8ebfce8ace961875c459d970c05a7f88"
    "6601000000f9bd0ccccdcccc3dcdcc4cbe00008040cdcc4c3ecdcc4cbe0000a0409a99993ecdcc4cbe0000c0"
    "409296307e5319ddbff0d35c8e91bbefbfe571706c24cbae3f071e948a8571f53f0000000000000000000000"
    "000000000000000000008047400000000000c0464000000000000046400000000000001f400000000000001d"
    "400000000000001a40020000000000000003000000000000000400000000000000"
)
"""`golden_record()` as the previous release wrote it (`EpisodeRecord.to_bytes`), format 1."""
GOLDEN_V2 = bytes.fromhex(
    "02000700000000000000040000000000000000002040fc54d94100005040fc54d94100020300000002000000"
    "01000000020065310300746f7901003204006162313201030000000300000002000000030000000000000000"
    "00494000000000000020400000000000001840000000000000f83ffec283450d9f596a09f0b33e6807df8ebf"
    "ce8ace961875c459d970c05a7f886601000000f9bd0ccccdcccc3dcdcc4cbe00008040cdcc4c3ecdcc4cbe00"
    "00a0409a99993ecdcc4cbe0000c0409296307e5319ddbff0d35c8e91bbefbfe571706c24cbae3f071e948a85"
    "71f53f0000000000000000000000000000000000000000008047400000000000c04640000000000000464000"
    "00000000001f400000000000001d400000000000001a40020000000000000003000000000000000400000000"
    "000000"
)
"""`guarded_golden_record()` in format 2."""
V2_FIXED = 48
"""Format 2's fixed fields; format 3 adds the shield's 4-byte count after them."""
GOLDEN_V3 = bytes([3]) + GOLDEN_V2[1:V2_FIXED] + bytes(4) + GOLDEN_V2[V2_FIXED:]
"""`guarded_golden_record()` in format 3 (no shield steps)."""
NO_CUT_FLOOR = struct.pack("<d", math.nan)
GOLDEN_V4 = bytes([4]) + GOLDEN_V3[1 : V2_FIXED + 4] + NO_CUT_FLOOR + GOLDEN_V3[V2_FIXED + 4 :]
"""`guarded_golden_record()` in format 4 (no cut floor)."""
NO_LAST_STEP = struct.pack("<dd", math.nan, math.nan)
CARD = ModelCard(
    name="toy",
    version="3",
    task="Toy",
    observation_dim=3,
    action_dim=2,
    action_low=[-1.0, -1.0],
    action_high=[1.0, 1.0],
    context_len=4,
    max_episode_len=100,
)
BOUNDS = (np.array([-1.0, -1.0]), np.array([1.0, 1.0]))
OBSERVATION = [0.1, -0.2, 0.3]


def golden_record() -> EpisodeRecord:
    context = EpisodeContext.start([1.0, 2.0, 3.0], 50.0, 10.0, context_len=3, action_dim=2, seed=7)
    for t in range(4):
        context.record_action(context.rng.standard_normal(2))
        context.advance(1.5, 0.25 * t, [0.1 * t, -0.2, 3.0 + t])
    context.set_budget(cost_limit=8.0)
    context.rng.random(dtype=np.float32)  # one 32-bit draw leaves the other half cached
    return EpisodeRecord(
        "e1", "toy", "2", False, 7, context, 1700000000.5, 1700000001.25, revision=4, owner="ab12"
    )


def guarded_golden_record() -> EpisodeRecord:
    """The golden record with the guard off, its newest action and counts set (format 2)."""
    return replace(
        golden_record(),
        budget_guard=False,
        guard_action=GuardAction.MEAN_ACTION,
        guard_tally=GuardTally(less_noise=3, mean_action=2, fallback=1),
    )


def assert_same_context(restored: EpisodeContext, expected: EpisodeContext) -> None:
    for name in ("states", "actions", "returns_to_go", "costs_to_go", "time_steps"):
        np.testing.assert_array_equal(getattr(restored, name), getattr(expected, name))
    assert restored.rng.bit_generator.state == expected.rng.bit_generator.state


def outputs(*mean: float) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    return np.array(mean, np.float32), np.full(len(mean), -1.0, np.float32)


def step_request(step: int) -> StepRequest:
    return StepRequest(observation=OBSERVATION, reward=2.0, cost=3.0, step=step)


def played(deterministic: bool = False) -> EpisodeRecord:
    """A record three sampled steps and a budget change in, owned by a non-ASCII principal."""
    request = EpisodeCreate(
        model="toy", target_reward=50.0, target_cost=10.0, observation=OBSERVATION,
        deterministic=deterministic,
    )  # fmt: skip
    record = open_episode(request, CARD, episode_id="e1", seed=7, owner="ålice", now=100.0)
    act(record.context, outputs(0.2, -0.4), BOUNDS, deterministic)
    for t in range(1, 4):
        context = advance(record.context, step_request(t), CARD)
        act(context, outputs(0.1 * t, -0.3), BOUNDS, deterministic)
        record = next_revision(record, context, now=100.0 + t)
    return rebudget(record, BudgetUpdate(remaining_cost=4.5), now=110.0)


def test_golden_record_of_format_1_decodes_with_the_guard_on_and_nothing_counted() -> None:
    expected = golden_record()
    restored = decode_record(GOLDEN)
    assert replace(restored, context=expected.context) == expected
    assert restored.budget_guard and restored.guard_action is GuardAction.NONE
    assert restored.guard_tally == GuardTally()
    assert_same_context(restored.context, expected.context)
    rewritten = encode_record(restored)  # written back in this release's format
    assert rewritten[0] == RECORD_FORMAT == 5 and rewritten[1:34] == GOLDEN[1:34]
    assert replace(decode_record(rewritten), context=expected.context) == expected


def test_golden_records_of_formats_2_to_4_decode_and_are_written_back_in_format_5() -> None:
    expected = guarded_golden_record()
    fixed = V2_FIXED + 12  # format 4's fixed fields: format 2's, the shield's count, the floor
    format_5 = bytes([5]) + GOLDEN_V4[1:fixed] + NO_LAST_STEP + GOLDEN_V4[fixed:]
    for golden in (GOLDEN_V2, GOLDEN_V3, GOLDEN_V4):
        restored = decode_record(golden)
        assert replace(restored, context=expected.context) == expected
        assert restored.cut_floor is None and restored.last_step is None
        assert_same_context(restored.context, expected.context)
        assert encode_record(restored) == format_5
    assert encode_record(expected) == format_5


def test_record_keeps_the_newest_steps_reward_and_cost() -> None:
    record = replace(guarded_golden_record(), last_step=(2.5, 0.0))
    assert decode_record(encode_record(record)).last_step == (2.5, 0.0)


def test_record_keeps_the_episodes_cut_floor() -> None:
    record = replace(guarded_golden_record(), cut_floor=10.0)
    assert decode_record(encode_record(record)).cut_floor == 10.0
    assert decode_record(encode_record(replace(record, cut_floor=0.0))).cut_floor == 0.0


def test_record_keeps_the_shields_count() -> None:
    record = replace(guarded_golden_record(), guard_tally=GuardTally(fallback=1, shield=7))
    restored = decode_record(encode_record(replace(record, guard_action=GuardAction.SHIELD)))
    assert restored.guard_tally == GuardTally(fallback=1, shield=7)
    assert restored.guard_action is GuardAction.SHIELD


def test_decode_record_refuses_an_unknown_guard_action() -> None:
    data = bytearray(GOLDEN_V2)
    data[35] = 9  # the guard action: after 34 bytes of format 1 fields and budget_guard
    with pytest.raises(RecordFormatError, match="damaged"):
        decode_record(bytes(data))


@pytest.mark.parametrize("deterministic", [False, True])
def test_record_round_trip_gives_the_same_record_and_next_actions(deterministic: bool) -> None:
    record = played(deterministic)
    restored = decode_record(encode_record(record))
    assert replace(restored, context=record.context) == record
    assert encode_context(restored.context) == encode_context(record.context)
    actions = []
    for context in (record.context, restored.context):  # both continue the same stream
        advanced = advance(context, step_request(4), CARD)
        act(advanced, outputs(0.0, 0.0), BOUNDS, deterministic)
        actions.append(advanced.last_action.tolist())
    assert actions[0] == actions[1]


def test_decode_record_refuses_another_format_clearly() -> None:
    data = bytearray(encode_record(played()))
    data[0] = RECORD_FORMAT + 1
    with pytest.raises(RecordFormatError, match=f"format {RECORD_FORMAT + 1}; this replica"):
        decode_record(bytes(data))
    with pytest.raises(RecordFormatError, match="format 123"):  # '{': a JSON record
        decode_record(b'{"episode_id": "e1"}')


def test_decode_record_refuses_a_damaged_record() -> None:
    data = encode_record(played())
    for damaged in (data[:10], data[:-3], data + b"x"):
        with pytest.raises(RecordFormatError, match="damaged"):
            decode_record(damaged)


def test_context_round_trip_restores_every_field_and_array() -> None:
    context = golden_record().context
    restored = decode_context(encode_context(context))
    for name in ("states", "actions", "returns_to_go", "costs_to_go", "time_steps"):
        original, copy = getattr(context, name), getattr(restored, name)
        np.testing.assert_array_equal(copy, original)
        assert copy.dtype == original.dtype and copy.flags.writeable
    scalars = ("length", "target_reward", "target_cost", "total_reward", "total_cost")
    assert [getattr(restored, name) for name in scalars] == [
        getattr(context, name) for name in scalars
    ]


def test_context_round_trip_continues_the_same_random_stream() -> None:
    context = golden_record().context
    assert context.rng.bit_generator.state["has_uint32"] == 1
    restored = decode_context(encode_context(context))
    np.testing.assert_array_equal(
        restored.rng.random(4, np.float32), context.rng.random(4, np.float32)
    )
    np.testing.assert_array_equal(restored.rng.standard_normal(4), context.rng.standard_normal(4))


def test_decode_context_refuses_another_format_version() -> None:
    data = bytearray(encode_context(golden_record().context))
    data[0] = CONTEXT_FORMAT + 1
    with pytest.raises(ValueError, match=f"format {CONTEXT_FORMAT + 1}; this code reads"):
        decode_context(bytes(data))


def test_encode_context_refuses_a_generator_other_than_pcg64() -> None:
    context = golden_record().context
    context.rng = np.random.Generator(np.random.MT19937(0))
    with pytest.raises(ValueError, match="MT19937"):
        encode_context(context)


@pytest.mark.parametrize("cut", [1, 40, -1])
def test_decode_context_refuses_a_truncated_buffer(cut: int) -> None:
    data = encode_context(golden_record().context)
    with pytest.raises(ValueError, match="bytes"):
        decode_context(data[:cut])
