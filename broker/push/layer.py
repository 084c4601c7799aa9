"""The Redis channel layer, plus what a push to thousands of sockets needs.

A leaf that delivers one event to a thousand receivers must reach a thousand client
groups. With plain `group_send` that is a thousand Redis messages, and a web process
pops them one by one. Here one script, one round trip, reads the members of all the
groups and gives each receiving process ONE message holding the payloads of the groups
whose members it serves (`group_send_each`).

In the receiving process, channels_redis would then put that message in the queue of
every consumer it names and wake each of them: a thousand task switches, each through
the layer's receive lock and Channels' dispatch; and every consumer would hold a queue
and a task waiting on it, memory at a fleet's size. A consumer can instead take a
*local channel* (`local_channel`), served by handlers by message type: the process's
one reader task hands such a message to one fan-out task, which calls the handlers of
all the channels it names in turn, in the order the messages came. Other channels are
served as before.

Redis keeps groups only in memory here: one that restarts has forgotten every member.
Each process checks, every MEMBERSHIP_CHECK_S, whether Redis still holds its mark (a
key with a time to live that the check renews); when the mark is gone, the process adds
all its channels to their groups again, in one round trip. One command per process per
check, rather than a join again per socket every few heartbeats. It also adds them
again every quarter of the layer's group expiry (a member joined longer ago than that
expiry is dropped from its group: an agent's session can last for days).

Both ends that write from worker threads do so on a plain (blocking) Redis client of
the same server: leaves push from their routing threads (`group_send_each`), agents'
logins join their clients' groups between the logins' statements, all the logins
waiting in a process at once (`group_add_many_blocking`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import redis
from channels_redis.core import RedisChannelLayer
from channels_redis.serializers import MsgPackSerializer
from django.core.exceptions import ImproperlyConfigured
from prometheus_client import Histogram
from redis.asyncio import BlockingConnectionPool
from redis.commands.core import Script
from redis.driver_info import DriverInfo

POOL_WAIT_S = 30
# redis-py resolves its own version (importlib.metadata, milliseconds of parsing) for
# every new connection unless it is given: a burst of logins opens many.
DRIVER_INFO = DriverInfo()
logger = logging.getLogger(__name__)
# A many-receiver push's message says when it was sent: each web process observes, once
# the push is written to its sockets, how long that took from the leaf (/metrics).
SENT_AT = "sent_at"
PUSH_SECONDS = Histogram(
    "sn_push_seconds",
    "Seconds from a leaf's push to its frames written to a web process's agent sockets",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

# How often a process checks that Redis still knows its channels' groups (at most this
# long after a restart, pushes to them go nowhere; the agents' confirmations then show
# the gap and it is replayed). The mark lives three checks: a loop that stalls for two
# of them costs one needless join again of the process's groups, nothing more.
MEMBERSHIP_CHECK_S = 5.0
MARK_LIVES_CHECKS = 3

LocalHandler = Callable[[dict], Awaitable[None]]
# What names a local channel (after the "!" of channels_redis' process part, so that its
# messages come in the process's one Redis key).
LOCAL_MARK = "local-"
READ_AGAIN_AFTER_S = 1.0
READ_FAILED_SAID_EVERY_S = 60.0

# A push in one round trip. For every group (KEYS), its live members, oldest expired
# first as channels_redis' group_send does; one message per receiving process (channel
# key), holding the payloads of the groups whose members it serves and the names of
# those members; each message admitted as channels_redis' group_send admits one: drop
# the key's expired messages, add it unless the key is at capacity. Returns how many
# were over capacity.
# The message is what channels_redis' msgpack serializer makes of
#   {"type": ..., "sent_at": ..., "groups": {group: payload, ...},
#    "__asgi_channel__": [channel, ...]}
# behind its 12-byte random prefix (8 random bytes from the caller and a counter, so
# that equal messages stay distinct members of the key's sorted set). The caller packs
# the "type" and "sent_at" pairs (ARGV[8]) and every group's name and payload, one
# after the other in KEYS' order (ARGV[9], with where each group's pair ends in
# ARGV[10]); the script only joins packed parts, since Lua cannot tell a Python
# payload's types. One argument for all the pairs, not two per group: redis-py packs
# each argument in Python.
PUSH_LUA = """
local oldest_member, prefix, now, expiry = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local oldest_message, capacity, random, head_pairs = ARGV[5], tonumber(ARGV[6]), ARGV[7], ARGV[8]

local function sized(n, small, fix, h8, h16, h32)
    if n < small then return string.char(fix + n) end
    if h8 and n < 256 then return string.char(h8, n) end
    if n < 65536 then return struct.pack('>BI2', h16, n) end
    return struct.pack('>BI4', h32, n)
end
local function packed_str(s) return sized(#s, 32, 0xa0, 0xd9, 0xda, 0xdb) .. s end

local pairs_packed, pair_ends = ARGV[9], cmsgpack.unpack(ARGV[10])
local messages, keys = {}, {}
for i = 1, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, oldest_member)
    for _, channel in ipairs(redis.call('ZRANGE', KEYS[i], 0, -1)) do
        local bang = string.find(channel, '!', 1, true)
        local key = prefix .. (bang and string.sub(channel, 1, bang) or channel)
        local message = messages[key]
        if not message then
            message = {groups = {}, channels = {}, last = 0}
            messages[key] = message
            keys[#keys + 1] = key
        end
        if message.last ~= i then
            local pair_start = i == 1 and 1 or pair_ends[i - 1] + 1
            message.groups[#message.groups + 1] = string.sub(pairs_packed, pair_start, pair_ends[i])
            message.last = i
        end
        message.channels[#message.channels + 1] = packed_str(channel)
    end
end

local over_capacity = 0
for n, key in ipairs(keys) do
    local message = messages[key]
    local value = random .. struct.pack('>I4', n) .. '\\132' .. head_pairs
        .. packed_str('groups') .. sized(#message.groups, 16, 0x80, nil, 0xde, 0xdf)
        .. table.concat(message.groups)
        .. packed_str('__asgi_channel__') .. sized(#message.channels, 16, 0x90, nil, 0xdc, 0xdd)
        .. table.concat(message.channels)
    redis.call('ZREMRANGEBYSCORE', key, 0, oldest_message)
    if redis.call('ZCOUNT', key, '-inf', '+inf') < capacity then
        redis.call('ZADD', key, now, value)
        redis.call('EXPIRE', key, expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""


def _packed_pairs(groups: list[str], payloads: dict[str, Any]) -> tuple[bytes, list[int]]:
    """Each group's name and payload packed, one after the other, and where each
    group's pair ends (in bytes). One packer buffer rather than a bytes object each."""
    packer = msgpack.Packer(autoreset=False)
    ends = []
    for group in groups:
        packer.pack(group)
        packer.pack(payloads[group])
        ends.append(len(packer.getbuffer()))
    return packer.bytes(), ends


def _running_on_this_loop(
    task: asyncio.Task | None, start: Callable[[], Awaitable[None]]
) -> asyncio.Task:
    """`task` if it still runs on the running loop, else `start()` as a new task there
    (a loop that ended, a test's earlier loop, took its tasks with it)."""
    loop = asyncio.get_running_loop()
    if task is None or task.done() or task.get_loop() is not loop:
        return loop.create_task(start())
    return task


class ChannelFullError(RuntimeError):
    """Some receiving process had too many messages waiting: refusing to drop silently."""


class FanoutRedisChannelLayer(RedisChannelLayer):
    """RedisChannelLayer with `group_send_each` and local fan-out, on a pool that waits
    for a free connection instead of failing: thousands of agents logging in at once
    each add a group, and redis-py's plain pool raises when its limit is reached."""

    def __init__(self, *args, membership_check_s: float = MEMBERSHIP_CHECK_S, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.membership_check_s = membership_check_s
        # This process's memberships, {group: {channel}}: written from the loop and from
        # logins' worker threads.
        self._memberships: dict[str, set[str]] = defaultdict(set)
        self._memberships_lock = threading.Lock()
        self._keeper_task: asyncio.Task | None = None
        self._joined_again_at = time.monotonic()
        self._mark_key = f"{self.prefix}:process:{secrets.token_hex(8)}"
        self._local_channels: dict[str, dict[str, LocalHandler]] = {}
        self._reader_task: asyncio.Task | None = None
        self._read_failed_said_at = -READ_FAILED_SAID_EVERY_S
        self._fan_out_queue: asyncio.Queue | None = None
        self._fan_out_task: asyncio.Task | None = None
        self._blocking_clients: dict[int, redis.Redis] = {}
        self._push_lua: Script | None = None
        self._check_push_can_serve()

    def _check_push_can_serve(self) -> None:
        """PUSH_LUA writes channels_redis' msgpack wire form itself, on one Redis host:
        refuse at start a configuration whose messages it would write differently."""
        serializer = self._serializer
        problems = [
            problem
            for problem, present in (
                ("more than one host", self.ring_size != 1),
                ("encrypted messages", serializer.crypter is not None),
                ("a serializer other than msgpack", not isinstance(serializer, MsgPackSerializer)),
                ("a random prefix other than 12 bytes", serializer.random_prefix_length != 12),
                ("per-channel capacities", bool(self.channel_capacity)),
            )
            if present
        ]
        if problems:
            raise ImproperlyConfigured(
                f"{type(self).__name__} cannot push with " + ", ".join(problems)
            )

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
        One round trip to Redis (PUSH_LUA). Blocking: for a caller in a worker thread."""
        groups = list(payloads)
        pairs_packed, pair_ends = _packed_pairs(groups, payloads)
        now = time.time()
        args: list[Any] = [
            int(now) - self.group_expiry, self.prefix, now, self.expiry,
            int(now) - int(self.expiry), self.capacity, secrets.token_bytes(8),
            # The message's first two pairs: its type, and when it was sent (/metrics).
            msgpack.packb("type") + msgpack.packb(message_type)
            + msgpack.packb(SENT_AT) + msgpack.packb(now),
            pairs_packed, msgpack.packb(pair_ends),
        ]  # fmt: skip
        keys = [self._group_key(group) for group in groups]
        over = self._push_script()(keys=keys, args=args)
        if over:
            raise ChannelFullError(f"{over} receiving processes are at channel capacity")

    def group_add_many_blocking(self, memberships: list[tuple[str, str]]) -> None:
        """`group_add` of many (group, channel), for a caller in a worker thread: the
        same Redis entries, in a round trip per Redis host."""
        pipes = {}
        now = time.time()
        for group, channel in memberships:
            self._remember(group, channel)
            index = self.consistent_hash(group)
            if index not in pipes:
                pipes[index] = self.blocking_client(index).pipeline(transaction=False)
            key = self._group_key(group)
            pipes[index].zadd(key, {channel: now})
            pipes[index].expire(key, self.group_expiry)
        for pipe in pipes.values():
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

    def _push_script(self) -> Script:
        """PUSH_LUA, run by its digest (EVALSHA)."""
        if self._push_lua is None:
            self._push_lua = self.blocking_client(0).register_script(PUSH_LUA)
        return self._push_lua

    # Memberships kept across a restart of Redis ----------------------------------------

    async def new_channel(self, prefix: str = "specific") -> str:
        """As channels_redis; also starts this loop's membership keeper (every consumer
        asks for its channel on the loop that serves it)."""
        self._keep_memberships_on_this_loop()
        return await super().new_channel(prefix)

    async def group_add(self, group: str, channel: str) -> None:
        self._remember(group, channel)
        await super().group_add(group, channel)

    async def group_discard(self, group: str, channel: str) -> None:
        with self._memberships_lock:
            members = self._memberships.get(group)
            if members is not None:
                members.discard(channel)
                if not members:
                    del self._memberships[group]
        await super().group_discard(group, channel)

    def _remember(self, group: str, channel: str) -> None:
        with self._memberships_lock:
            self._memberships[group].add(channel)

    def _keep_memberships_on_this_loop(self) -> None:
        self._keeper_task = _running_on_this_loop(self._keeper_task, self._keep_memberships)

    async def _keep_memberships(self) -> None:
        while True:
            await asyncio.sleep(self.membership_check_s)
            try:
                await self.check_memberships()
            except Exception:  # Redis down: the next check tries again
                logger.warning("checking the channel layer's memberships failed", exc_info=True)

    async def check_memberships(self) -> bool:
        """Renew this process's mark in Redis; if it was gone (Redis restarted and forgot
        the groups too), or a quarter of the group expiry went by, add every channel of
        the process to its groups again. True if it did."""
        server = self.connection(0)
        lives_s = max(1, round(self.membership_check_s * MARK_LIVES_CHECKS))
        remembered = await server.set(self._mark_key, 1, ex=lives_s, get=True) is not None
        due = time.monotonic() - self._joined_again_at >= self.group_expiry / 4
        if remembered and not due:
            return False
        self._joined_again_at = time.monotonic()
        with self._memberships_lock:
            memberships = [(group, list(members)) for group, members in self._memberships.items()]
        pipe, now = server.pipeline(transaction=False), time.time()
        for group, members in memberships:
            pipe.zadd(self._group_key(group), dict.fromkeys(members, now))
            pipe.expire(self._group_key(group), self.group_expiry)
        await pipe.execute()
        why = "before their expiry" if remembered else "Redis had forgotten them"
        logger.info("joined %d groups again (%s)", len(memberships), why)
        return True

    # Receiving: local channels and fan-out --------------------------------------------

    def local_channel(self, handlers: dict[str, LocalHandler]) -> str:
        """A new channel of this process whose messages go to `handlers` (by message
        type) on this loop, never to a queue: its consumer neither holds a queue nor
        waits in `receive`, and one task of the process reads for all such channels.
        A message of another type for it is dropped (logged)."""
        channel = self._local_name(uuid.uuid4().hex)
        self._local_channels[channel] = handlers
        self._keep_memberships_on_this_loop()
        self._read_on_this_loop()
        return channel

    def drop_local_channel(self, channel: str) -> None:
        """Stop serving `channel`: its messages still on their way are dropped."""
        self._local_channels.pop(channel, None)

    def _local_name(self, suffix: str) -> str:
        """A local channel's name: in this process's part of channels_redis' names (as
        `new_channel` makes them), marked as local."""
        return f"specific.{self.client_prefix}!{LOCAL_MARK}{suffix}"

    def _read_on_this_loop(self) -> None:
        self._reader_task = _running_on_this_loop(self._reader_task, self._read_for_local_channels)

    async def _read_for_local_channels(self) -> None:
        """Receive on a channel of its own that no message is for: channels_redis then
        reads the process's messages under its receive lock, handing them out (to the
        local handlers through `receive_single`, to other consumers' queues), as long as
        this task lives. A Redis that fails is tried again a second later."""
        channel = self._local_name("reader")
        while True:
            try:
                await self.receive(channel)
            except Exception as error:
                if asyncio.current_task().cancelling():  # channels_redis, cancelled, may
                    raise asyncio.CancelledError from error  # raise an error of its own
                self._say_reading_failed()
                await asyncio.sleep(READ_AGAIN_AFTER_S)

    def _say_reading_failed(self) -> None:
        """Log a failed read, at most once every READ_FAILED_SAID_EVERY_S: a Redis that is
        down fails every second, and its outage should not bury the process's log."""
        now = time.monotonic()
        if now - self._read_failed_said_at >= READ_FAILED_SAID_EVERY_S:
            self._read_failed_said_at = now
            logger.warning("reading the channel layer failed (retrying)", exc_info=True)

    async def receive_single(self, channel):
        """As channels_redis, but a message's local channels (`local_channel`) are
        served by the fan-out task, and only the others queued."""
        target, message = await super().receive_single(channel)
        targets = target if isinstance(target, list) else [target]
        message_type = message.get("type")
        handlers, others = [], []
        for name in targets:
            if LOCAL_MARK not in name:
                others.append(name)
            elif (handler := self._local_channels.get(name, {}).get(message_type)) is not None:
                handlers.append(handler)
            else:  # its consumer has gone, or it takes no such message
                logger.debug("dropped a %s message for %s", message_type, name)
        if handlers:
            self._fan_out_later(message, handlers)
        return others, message

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
            if SENT_AT in message:
                PUSH_SECONDS.observe(max(0.0, time.time() - message[SENT_AT]))
