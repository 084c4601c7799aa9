"""The Redis channel layer, plus one operation: different payloads to many groups.

A leaf that delivers one event to a thousand receivers must reach a thousand client
groups. With plain `group_send` that is a thousand Redis messages, and a Daphne process
pops them one by one: the push alone would take the better part of a second. Here the
members of all the groups are read in one round trip, and each receiving process gets
ONE message holding the payloads of the groups whose members it serves; channels_redis
already hands one Redis message to several local consumers (`__asgi_channel__`), and
each consumer takes its own group's payload out of it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from channels_redis.core import RedisChannelLayer
from redis.asyncio import BlockingConnectionPool

POOL_WAIT_S = 30

# The same admission as channels_redis' group_send: per channel key, add the message
# unless the key is at capacity; return how many were over capacity.
SEND_LUA = """
local over_capacity = 0
local current_time = ARGV[#ARGV - 1]
local expiry = ARGV[#ARGV]
for i=1,#KEYS do
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
        redis.call('ZADD', KEYS[i], current_time, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""


class ChannelFullError(RuntimeError):
    """Some receiving process had too many messages waiting: refusing to drop silently."""


class FanoutRedisChannelLayer(RedisChannelLayer):
    """RedisChannelLayer with `group_send_each`, on a pool that waits for a free
    connection instead of failing: thousands of agents logging in at once each add a
    group, and redis-py's plain pool raises when its limit is reached."""

    def create_pool(self, index: int):
        host = dict(self.hosts[index])
        address = host.pop("address")
        return BlockingConnectionPool.from_url(address, timeout=POOL_WAIT_S, **host)

    async def group_send_each(self, payloads: dict[str, Any], *, message_type: str) -> None:
        """Send every group in `payloads` its own payload. A consumer receives
        {"type": message_type, "groups": {group: payload, ...}} and reads its group's."""
        members = await self._members(list(payloads))
        messages: dict[bytes, dict] = {}
        index_of: dict[bytes, int] = {}
        for group, channels in members.items():
            for channel in channels:
                non_local = self.non_local_name(channel) if "!" in channel else channel
                key = (self.prefix + non_local).encode()
                message = messages.setdefault(
                    key, {"type": message_type, "groups": {}, "__asgi_channel__": []}
                )
                message["groups"][group] = payloads[group]
                message["__asgi_channel__"].append(channel)
                index_of[key] = self.consistent_hash(non_local)
        await self._store(messages, index_of)

    async def _members(self, groups: list[str]) -> dict[str, list[str]]:
        """{group: its live member channels}, in one round trip per Redis host."""
        by_index: dict[int, list[str]] = defaultdict(list)
        for group in groups:
            by_index[self.consistent_hash(group)].append(group)
        oldest = int(time.time()) - self.group_expiry
        members: dict[str, list[str]] = {}
        for index, its_groups in by_index.items():
            pipe = self.connection(index).pipeline(transaction=False)
            for group in its_groups:
                pipe.zremrangebyscore(self._group_key(group), min=0, max=oldest)
                pipe.zrange(self._group_key(group), 0, -1)
            replies = await pipe.execute()
            for group, channels in zip(its_groups, replies[1::2], strict=True):
                members[group] = [channel.decode() for channel in channels]
        return members

    async def _store(self, messages: dict[bytes, dict], index_of: dict[bytes, int]) -> None:
        by_index: dict[int, list[bytes]] = defaultdict(list)
        for key in messages:
            by_index[index_of[key]].append(key)
        over = 0
        for index, keys in by_index.items():
            connection = self.connection(index)
            pipe = connection.pipeline(transaction=False)
            for key in keys:  # drop expired messages first, as group_send does
                pipe.zremrangebyscore(key, min=0, max=int(time.time()) - int(self.expiry))
            await pipe.execute()
            args = [self.serialize(messages[key]) for key in keys]
            args += [self.get_capacity(messages[key]["__asgi_channel__"][0]) for key in keys]
            args += [time.time(), self.expiry]
            over += await connection.eval(SEND_LUA, len(keys), *keys, *args)
        if over:
            raise ChannelFullError(f"{over} receiving processes are at channel capacity")
