"""group_send_each against the real Redis: each group's members get their own payload,
and one Redis message serves every member a process holds."""

from __future__ import annotations

import asyncio

from channels.layers import get_channel_layer


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
