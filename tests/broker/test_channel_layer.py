"""group_send_each against the real Redis: each group's members get their own payload,
one Redis message serves every member a process holds, and that message is what
channels_redis itself would have written."""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from broker.push.layer import ChannelFullError, FanoutRedisChannelLayer


def unsent(message: dict) -> dict:
    """The message without when it was sent, which must be a moment ago."""
    rest = dict(message)
    assert 0 <= time.time() - rest.pop("sent_at") < 30
    return rest


def test_each_member_reads_its_own_groups_payload_from_one_shared_message():
    async def scenario():
        layer = get_channel_layer()
        a, b, c = [await layer.new_channel() for _ in range(3)]
        await layer.group_add("test.alpha", a)
        await layer.group_add("test.alpha", b)
        await layer.group_add("test.beta", c)
        # As a leaf pushes: blocking, from a worker thread.
        await asyncio.to_thread(
            layer.group_send_each,
            {"test.alpha": [1, 2], "test.beta": [3], "test.nobody": [4]},
            message_type="test.push",
        )
        got = [await asyncio.wait_for(layer.receive(ch), 5) for ch in (a, b, c)]
        for group, channel in (("test.alpha", a), ("test.alpha", b), ("test.beta", c)):
            await layer.group_discard(group, channel)
        return got

    got_a, got_b, got_c = asyncio.run(scenario())
    assert got_a["type"] == "test.push" and got_a["groups"]["test.alpha"] == [1, 2]
    assert got_b["groups"]["test.alpha"] == [1, 2]
    assert got_c["groups"]["test.beta"] == [3]
    # a, b and c live in this one process: one message carried all three payloads
    assert got_a["groups"] == got_c["groups"] == {"test.alpha": [1, 2], "test.beta": [3]}


def layer_like_the_settings(**config):
    """A second layer on the settings' Redis, configured otherwise."""
    settings_layer = get_channel_layer()
    host = {"address": settings.CHANNEL_LAYER_URL, "socket_timeout": 30}
    return FanoutRedisChannelLayer(hosts=[host], prefix=settings_layer.prefix, **config)


def test_a_push_reads_back_as_channels_redis_wrote_it_whatever_the_sizes():
    # Past every msgpack size step the script writes itself for names (channels_redis
    # allows ASCII of up to 99 characters: channels' names are over 31), groups in one
    # message (over 15) and members of one process (over 15).
    groups = {f"test.size.{n}": [n, {"é": "x" * n}] for n in range(18)}
    long_names = {"test." + "w" * 30: None, "test." + "n" * 94: {"ü": [[1.5, -(2**40)]]}}
    payloads = {**groups, **long_names}

    async def scenario():
        layer, other_process = get_channel_layer(), layer_like_the_settings()
        crowd = [await layer.new_channel() for _ in range(17)]
        elsewhere = await other_process.new_channel()
        joined = [(group, crowd[len(group) % 17]) for group in payloads]
        joined += [("test.size.0", channel) for channel in crowd]
        for group, channel in joined:
            await layer.group_add(group, channel)
        await other_process.group_add("test.size.1", elsewhere)
        await asyncio.to_thread(layer.group_send_each, payloads, message_type="test.push")
        here = [await asyncio.wait_for(layer.receive(channel), 5) for channel in crowd]
        there = await asyncio.wait_for(other_process.receive(elsewhere), 5)
        for group, channel in [*joined, ("test.size.1", elsewhere)]:
            await layer.group_discard(group, channel)
        return here, there

    here, there = asyncio.run(scenario())
    assert all(unsent(message) == {"type": "test.push", "groups": payloads} for message in here)
    assert unsent(there) == {
        "type": "test.push",
        "groups": {"test.size.1": payloads["test.size.1"]},
    }


def test_the_same_push_twice_arrives_twice():
    async def scenario():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add("test.twice", channel)
        for _ in range(2):
            await asyncio.to_thread(layer.group_send_each, {"test.twice": [1]}, message_type="t")
        got = [await asyncio.wait_for(layer.receive(channel), 5) for _ in range(2)]
        await layer.group_discard("test.twice", channel)
        return got

    messages = asyncio.run(scenario())
    assert [unsent(message) for message in messages] == [
        {"type": "t", "groups": {"test.twice": [1]}}
    ] * 2


def test_a_receiving_process_at_capacity_fails_the_push_instead_of_dropping_it():
    async def scenario():
        layer = layer_like_the_settings(capacity=1)
        channel = await layer.new_channel()
        await layer.group_add("test.full", channel)
        await asyncio.to_thread(layer.group_send_each, {"test.full": [1]}, message_type="t")
        with pytest.raises(ChannelFullError, match="1 receiving processes are at channel capacity"):
            await asyncio.to_thread(layer.group_send_each, {"test.full": [2]}, message_type="t")
        got = await asyncio.wait_for(layer.receive(channel), 5)
        await layer.group_discard("test.full", channel)
        return got

    assert asyncio.run(scenario())["groups"] == {"test.full": [1]}


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"hosts": [{"address": "redis://a"}, {"address": "redis://b"}]}, "more than one host"),
        ({"symmetric_encryption_keys": ["k" * 32]}, "encrypted messages"),
        ({"serializer_format": "json"}, "a serializer other than msgpack"),
        ({"random_prefix_length": 16}, "a random prefix other than 12 bytes"),
        ({"channel_capacity": {"http.*": 10}}, "per-channel capacities"),
    ],
)
def test_a_configuration_whose_messages_the_push_would_write_otherwise_is_refused(config, problem):
    config = {"hosts": [{"address": "redis://a"}], **config}
    with pytest.raises(ImproperlyConfigured, match=f"cannot push with {problem}"):
        FanoutRedisChannelLayer(**config)


class Recorder:
    """Handlers of a local channel that note what they were handed, in order."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict]] = []
        self.arrived = asyncio.Event()

    def handler(self, name: str):
        async def handle(message: dict) -> None:
            self.got.append((name, message))
            self.arrived.set()

        return handle

    async def wait_for(self, count: int) -> None:
        while len(self.got) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 5)


async def settled() -> None:
    """Let the layer's reader wait for its next message again before the loop ends: a
    channels_redis receive cancelled while its last message's clean-up runs can swallow
    the cancellation and keep the loop from closing."""
    await asyncio.sleep(0.1)


def test_a_local_channel_is_handed_its_messages_by_type_and_keeps_no_queue():
    async def scenario():
        layer, recorder = layer_like_the_settings(), Recorder()
        local = layer.local_channel(
            {"test.push": recorder.handler("push"), "test.end": recorder.handler("end")}
        )
        plain = await layer.new_channel()  # a consumer of its own, beside it
        for channel in (local, plain):
            await layer.group_add("test.local", channel)
        await asyncio.to_thread(
            layer.group_send_each, {"test.local": [1]}, message_type="test.push"
        )
        await layer.group_send("test.local", {"type": "test.unknown"})
        await layer.group_send("test.local", {"type": "test.end"})
        await recorder.wait_for(2)
        plain_got = [await asyncio.wait_for(layer.receive(plain), 5) for _ in range(3)]
        for channel in (local, plain):
            await layer.group_discard("test.local", channel)
        await settled()
        return recorder.got, plain_got, local in layer.receive_buffer

    got, plain_got, queued = asyncio.run(scenario())
    assert [(name, message["type"]) for name, message in got] == [
        ("push", "test.push"), ("end", "test.end"),
    ]  # fmt: skip
    assert got[0][1]["groups"] == {"test.local": [1]}
    assert [message["type"] for message in plain_got] == ["test.push", "test.unknown", "test.end"]
    assert not queued  # the unknown type was dropped, not queued for nobody


def test_a_dropped_local_channel_is_handed_nothing_more_and_nothing_is_queued_for_it():
    async def scenario():
        layer, recorder, witness = layer_like_the_settings(), Recorder(), Recorder()
        gone = layer.local_channel({"test.push": recorder.handler("gone")})
        here = layer.local_channel({"test.push": witness.handler("here")})
        for channel in (gone, here):
            await layer.group_add("test.gone", channel)
        layer.drop_local_channel(gone)
        await asyncio.to_thread(layer.group_send_each, {"test.gone": [1]}, message_type="test.push")
        await witness.wait_for(1)
        for channel in (gone, here):
            await layer.group_discard("test.gone", channel)
        await settled()
        return recorder.got, witness.got, gone in layer.receive_buffer

    gone_got, here_got, queued = asyncio.run(scenario())
    assert gone_got == [] and len(here_got) == 1 and not queued


def test_the_local_channels_reader_reads_again_after_redis_failed_saying_so_once(
    monkeypatch, caplog
):
    monkeypatch.setattr("broker.push.layer.READ_AGAIN_AFTER_S", 0.05)

    async def scenario():
        layer, recorder = layer_like_the_settings(), Recorder()
        failures = iter([ConnectionError("Redis went away")] * 3)
        read = layer._brpop_with_clean

        async def fails_thrice(*args, **kwargs):
            if (failure := next(failures, None)) is not None:
                raise failure
            return await read(*args, **kwargs)

        layer._brpop_with_clean = fails_thrice
        channel = layer.local_channel({"test.push": recorder.handler("push")})
        await layer.group_add("test.again", channel)
        await asyncio.sleep(0.4)  # the first reads failed, the next one waits
        push = {"test.again": [1]}
        await asyncio.to_thread(layer.group_send_each, push, message_type="test.push")
        await recorder.wait_for(1)
        await layer.group_discard("test.again", channel)
        await settled()
        return next(failures, None), recorder.got

    left, got = asyncio.run(scenario())
    assert left is None and got[0][1]["groups"] == {"test.again": [1]}
    said = [r for r in caplog.records if "reading the channel layer failed" in r.message]
    assert len(said) == 1  # three failures in a row, said once


def forget(layer: FanoutRedisChannelLayer, groups: list[str]) -> None:
    """What a Redis that restarted has lost of this process: its mark and groups."""
    server = layer.blocking_client(0)
    server.delete(layer._mark_key, *(layer._group_key(group) for group in groups))


def members(layer: FanoutRedisChannelLayer, group: str) -> set[str]:
    return {m.decode() for m in layer.blocking_client(0).zrange(layer._group_key(group), 0, -1)}


def test_a_process_joins_its_groups_again_once_redis_has_forgotten_them():
    async def scenario():
        layer = layer_like_the_settings()
        a, b, gone = [await layer.new_channel() for _ in range(3)]
        await layer.group_add("test.keep.alpha", a)
        await asyncio.to_thread(layer.group_add_many_blocking, [("test.keep.beta", b)])  # a login
        await layer.group_add("test.keep.alpha", gone)
        await layer.group_discard("test.keep.alpha", gone)
        first = await layer.check_memberships()  # no mark yet: joins again, harmlessly
        remembered = await layer.check_memberships()
        forget(layer, ["test.keep.alpha", "test.keep.beta"])
        joined_again = await layer.check_memberships()
        found = members(layer, "test.keep.alpha"), members(layer, "test.keep.beta")
        await asyncio.to_thread(
            layer.group_send_each, {"test.keep.beta": ["after"]}, message_type="test.push"
        )
        received = await asyncio.wait_for(layer.receive(b), 5)
        await layer.group_discard("test.keep.alpha", a)
        await layer.group_discard("test.keep.beta", b)
        return first, remembered, joined_again, found, received, (a, b)

    first, remembered, joined_again, found, received, (a, b) = asyncio.run(scenario())
    assert (first, remembered, joined_again) == (True, False, True)
    assert found == ({a}, {b})  # the channel that left is not brought back
    assert received["groups"] == {"test.keep.beta": ["after"]}


def test_a_process_joins_its_groups_again_before_they_would_expire():
    # A session outlives the layer's group expiry (a day by default): its membership
    # must be renewed, or pushes to it stop.
    async def scenario():
        layer = layer_like_the_settings(group_expiry=8)  # renewed every 2 s
        channel = await layer.new_channel()
        await layer.group_add("test.keep.long", channel)
        server = layer.blocking_client(0)
        key = layer._group_key("test.keep.long")
        checks = [await layer.check_memberships(), await layer.check_memberships()]
        joined_at = server.zscore(key, channel)
        await asyncio.sleep(2.1)
        checks.append(await layer.check_memberships())
        renewed_at = server.zscore(key, channel)
        await layer.group_discard("test.keep.long", channel)
        return checks, renewed_at - joined_at

    checks, renewed_after_s = asyncio.run(scenario())
    assert checks == [True, False, True] and renewed_after_s >= 2


def test_the_keeper_checks_by_itself_while_the_process_serves_channels():
    async def scenario():
        layer = layer_like_the_settings(membership_check_s=0.2)
        channel = await layer.new_channel()  # starts the keeper on this loop
        await layer.group_add("test.keep.auto", channel)
        await asyncio.sleep(0.5)
        forget(layer, ["test.keep.auto"])
        for _ in range(50):
            await asyncio.sleep(0.1)
            if members(layer, "test.keep.auto"):
                break
        found = members(layer, "test.keep.auto")
        await layer.group_discard("test.keep.auto", channel)
        return found, channel

    found, channel = asyncio.run(scenario())
    assert found == {channel}
