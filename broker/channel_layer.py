"""The Redis channel layer, plus what a push to thousands of sockets needs.

A leaf that delivers one event to a thousand receivers must reach a thousand client
groups. With plain `group_send` that is a thousand Redis messages, and a Daphne process
pops them one by one. Here the members of all the groups are read in one round trip
(one script), and each receiving process gets ONE message holding the payloads of the
groups whose members it serves (`group_send_each`).

In the receiving process, channels_redis would then put that message in the queue of
every consumer it names and wake each of them: a thousand task switches, each through
the layer's receive lock and Channels' dispatch. A consumer can instead register a
*local handler* for one type of message on its channel (`deliver_locally`): the
process's reader hands such a message to one fan-out task, which calls the handlers of
all the consumers it names in turn, in the order the messages came. Other messages, and
channels without a handler, are served as before.

Both ends that write from worker threads do so on a plain (blocking) Redis client of
the same server: leaves push from their routing threads (`group_send_each`), agents'
logins join their client's group inside the login's one database round trip
(`group_add_blocking`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import redis
from channels_redis.core import RedisChannelLayer
from redis.asyncio import BlockingConnectionPool
from redis.commands.core import Script
from redis.driver_info import DriverInfo

POOL_WAIT_S = 30
# redis-py resolves its own version (importlib.metadata, milliseconds of parsing) for
# every new connection unless it is given: a burst of logins opens many.
DRIVER_INFO = DriverInfo()
logger = logging.getLogger(__name__)

LocalHandler = Callable[[dict], Awaitable[None]]

# Every group's live members, oldest expired first (as channels_redis' group_send
# does), one string per group: the members joined by spaces (channel names hold none).
MEMBERS_LUA = """
local found = {}
for i = 1, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, ARGV[1])
    found[i] = table.concat(redis.call('ZRANGE', KEYS[i], 0, -1), ' ')
end
return found
"""

# The same admission as channels_redis' group_send: per channel key, drop expired
# messages, then add the message unless the key is at capacity; return how many were
# over capacity.
SEND_LUA = """
local over_capacity = 0
local current_time = ARGV[#ARGV - 2]
local expiry = ARGV[#ARGV - 1]
local oldest = ARGV[#ARGV]
for i=1,#KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, oldest)
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
    """RedisChannelLayer with `group_send_each` and local fan-out, on a pool that waits
    for a free connection instead of failing: thousands of agents logging in at once
    each add a group, and redis-py's plain pool raises when its limit is reached."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._local_handlers: dict[str, dict[str, LocalHandler]] = defaultdict(dict)
        self._fan_out_queue: asyncio.Queue | None = None
        self._fan_out_task: asyncio.Task | None = None
        self._blocking_clients: dict[int, redis.Redis] = {}
        self._registered: dict[int, tuple[Script, Script]] = {}

    def create_pool(self, index: int):
        host = dict(self.hosts[index])
        address = host.pop("address")
        return BlockingConnectionPool.from_url(
            address, timeout=POOL_WAIT_S, driver_info=DRIVER_INFO, **host
        )

    # Sending and joining from worker threads ------------------------------------------
    # Leaves push from their routing threads, and logins join groups from theirs: on a
    # plain Redis client per host, shared by the process's threads, rather than a hop to
    # an event loop and back (a thread switch each way, under load a wait for the GIL).

    def group_send_each(self, payloads: dict[str, Any], *, message_type: str) -> None:
        """Send every group in `payloads` its own payload. A consumer receives
        {"type": message_type, "groups": {group: payload, ...}} and reads its group's.
        Blocking: for a caller in a worker thread."""
        members = self._members(list(payloads))
        messages: dict[bytes, dict] = {}
        index_of: dict[bytes, int] = {}
        for group, channels in members.items():
            for channel in channels:
                non_local = self.non_local_name(channel) if "!" in channel else channel
                key = (self.prefix + non_local).encode()
                message = messages.get(key)
                if message is None:
                    message = messages[key] = {
                        "type": message_type, "groups": {}, "__asgi_channel__": []
                    }  # fmt: skip
                    index_of[key] = self.consistent_hash(non_local)
                message["groups"][group] = payloads[group]
                message["__asgi_channel__"].append(channel)
        self._store(messages, index_of)

    def _members(self, groups: list[str]) -> dict[str, list[str]]:
        """{group: its live member channels}, in one round trip per Redis host."""
        by_index: dict[int, list[str]] = defaultdict(list)
        for group in groups:
            by_index[self.consistent_hash(group)].append(group)
        oldest = int(time.time()) - self.group_expiry
        members: dict[str, list[str]] = {}
        for index, its_groups in by_index.items():
            keys = [self._group_key(group) for group in its_groups]
            found = self._scripts(index)[0](keys=keys, args=[oldest])
            for group, joined in zip(its_groups, found, strict=True):
                if joined:
                    members[group] = joined.decode().split(" ")
        return members

    def _store(self, messages: dict[bytes, dict], index_of: dict[bytes, int]) -> None:
        by_index: dict[int, list[bytes]] = defaultdict(list)
        for key in messages:
            by_index[index_of[key]].append(key)
        over = 0
        now = time.time()
        for index, keys in by_index.items():
            args = [self.serialize(messages[key]) for key in keys]
            args += [self.get_capacity(messages[key]["__asgi_channel__"][0]) for key in keys]
            args += [now, self.expiry, int(now) - int(self.expiry)]
            over += self._scripts(index)[1](keys=keys, args=args)
        if over:
            raise ChannelFullError(f"{over} receiving processes are at channel capacity")

    def group_add_blocking(self, group: str, channel: str) -> None:
        """`group_add` for a caller in a worker thread: the same Redis entries."""
        key = self._group_key(group)
        pipe = self.blocking_client(self.consistent_hash(group)).pipeline(transaction=False)
        pipe.zadd(key, {channel: time.time()})
        pipe.expire(key, self.group_expiry)
        pipe.execute()

    def blocking_client(self, index: int) -> redis.Redis:
        """The plain (blocking) client of Redis host `index`, shared by the threads."""
        client = self._blocking_clients.get(index)
        if client is None:
            host = dict(self.hosts[index])
            address = host.pop("address")
            client = redis.Redis.from_url(address, driver_info=DRIVER_INFO, **host)
            client = self._blocking_clients.setdefault(index, client)
        return client

    def _scripts(self, index: int) -> tuple[Script, Script]:
        """MEMBERS_LUA and SEND_LUA on host `index`, run by their digest (EVALSHA)."""
        scripts = self._registered.get(index)
        if scripts is None:
            client = self.blocking_client(index)
            scripts = (client.register_script(MEMBERS_LUA), client.register_script(SEND_LUA))
            scripts = self._registered.setdefault(index, scripts)
        return scripts

    # Receiving: local fan-out -----------------------------------------------------------

    def deliver_locally(self, channel: str, message_type: str, handler: LocalHandler) -> None:
        """Hand messages of `message_type` for `channel` (one of this process's) to
        `handler` on the receiving loop, instead of queueing them for its consumer."""
        self._local_handlers[message_type][channel] = handler

    def stop_delivering_locally(self, channel: str, message_type: str) -> None:
        self._local_handlers[message_type].pop(channel, None)

    async def receive_single(self, channel):
        """As channels_redis, but the channels of a many-channel message that have a
        local handler for its type are served by the fan-out task, and only the others
        queued."""
        target, message = await super().receive_single(channel)
        local = self._local_handlers.get(message.get("type"))
        if isinstance(target, list) and local:
            handlers = [handler for c in target if (handler := local.get(c)) is not None]
            if handlers:
                self._fan_out_later(message, handlers)
                target = [c for c in target if c not in local]
        return target, message

    def _fan_out_later(self, message: dict, handlers: list[LocalHandler]) -> None:
        if self._fan_out_task is None or self._fan_out_task.done():
            self._fan_out_queue = asyncio.Queue()
            self._fan_out_task = asyncio.get_running_loop().create_task(self._fan_out())
        self._fan_out_queue.put_nowait((message, handlers))

    async def _fan_out(self) -> None:
        """One task per process: messages in the order they came, each handler in
        turn; one handler failing (its socket just closed) does not stop the others."""
        while True:
            message, handlers = await self._fan_out_queue.get()
            for handler in handlers:
                try:
                    await handler(message)
                except Exception:
                    logger.warning("a local delivery failed", exc_info=True)
