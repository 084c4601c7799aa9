"""The agent a managed server runs (`sn-agent run --config FILE`; docs/agent.md).

It states the server's attributes (static, and measured by providers), keeps its
connectivity policy, and runs the configured action each notification asks for, one
at a time in position order, answering the console with the outcome. What it was
handed and what became of it is in its journal, so that a restart, however abrupt,
never runs a delivery's action twice and never skips one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from pathlib import Path
from typing import Any, Dict, Optional

from sn_agent import __version__, actions, expressions, providers, signatures
from sn_agent.client import ACTS_ON_NOTHING, Agent, AgentError, Notification
from sn_agent.config import Config, ConfigError, load, warnings
from sn_agent.journal import Journal
from sn_agent.logs import emit

PRUNE_EVERY = 200
# The answer to a notification without an action, when the configuration asks for one.
NOTED = actions.Outcome("ok", {"exit_code": None, "output": "noted (no action asked)"})
# What a request may end with when the connection goes or the console refuses: the
# next login states everything again.
LOST = (AgentError, ConnectionError, OSError, asyncio.TimeoutError)
RESTARTED_DURING_THE_ACTION = (
    "the agent stopped while the action ran, and the action did not finish; "
    "it may have done part of its work"
)
NOTHING_VERIFIED = (
    "this agent has no [trust], so it cannot tell a command its sender signed from one "
    "written into the console's database: it runs none (docs/agent.md)"
)
EARLIER_JOURNAL = "an earlier journal may have acted on it"
# How long an event whose lifetime the agent cannot know (not signed: an agent that
# acts on unsigned events) is remembered: the longest lifetime the console gives.
UNSIGNED_MEMORY_S = 7 * 24 * 3600 + signatures.CLOCK_SKEW_S


def boot_id() -> str:
    """This boot of the machine (a process id means nothing across reboots)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


class AgentService:
    """One agent: its configuration, journal and connection."""

    def __init__(self, config: Config, *, observer=None) -> None:
        self.config = config
        # Sees every notification as it comes off the wire (sn_agent.client.Agent).
        self.observer = observer
        self.boot = boot_id()
        self.journal: Optional[Journal] = None
        self.agent: Optional[Agent] = None
        self.measured: Dict[str, Any] = {}
        self.busy = False
        self.stopping = False
        self.handled = 0
        # Until when the event being handled is remembered (set as it is checked).
        self.remember_until: Optional[float] = None
        self._main: Optional[asyncio.Task] = None
        self._reloading: Optional[asyncio.Future] = None
        # What a verifying agent checks events against (compiled once per configuration).
        self.policy_test = config.policy_test()

    # Life ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Recover what a previous run left, then serve until stopped (SIGTERM)."""
        state_dir = self.config.state_dir
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError("state_dir", f"cannot create {state_dir}: {error.strerror}") from None
        self.journal = Journal(state_dir)
        self.journal.set_fact("pid", os.getpid())
        self.journal.set_fact("connected", False)
        try:
            await self.recover()
            await self._measure_all()
            self.journal.set_attributes_since(self._own_attributes())
            after = self.journal.position()
            self.agent = Agent(
                self.config.url, self.config.token(), after_position=after,
                observer=self.observer, about=self._about(),
            )  # fmt: skip
            emit("starting", url=self.config.url, position=after, acts_on=self.config.acts_on)
            for warning in warnings(self.config):
                emit("warning", message=warning)
            await self._serve()
        finally:
            await self._shut_down()

    async def _serve(self) -> None:
        measuring = [asyncio.ensure_future(self._keep_measuring(p)) for p in self._providers()]
        self._main = asyncio.ensure_future(self.agent.run(self.handle, on_connect=self.on_connect))
        if self.stopping:  # stopped while it was starting
            self._main.cancel()
        try:
            await self._main
        except asyncio.CancelledError:
            if not self.stopping:
                raise
        finally:
            for task in measuring:
                task.cancel()
            await asyncio.gather(*measuring, return_exceptions=True)

    async def _shut_down(self) -> None:
        if self.agent is not None:
            with contextlib.suppress(Exception):
                await self.agent.close()
        if self.journal is not None:
            self.journal.set_fact("connected", False)
            self.journal.close()
        emit("stopped")

    def stop(self) -> None:
        """SIGTERM: let a running action finish (within its time-out), then stop."""
        self.stopping = True
        emit("stopping", waiting_for_action=self.busy)
        if not self.busy and self._main is not None:
            self._main.cancel()

    def reload(self) -> None:
        """SIGHUP: read the configuration again; keep the old one if it is wrong."""
        try:
            config = load(self.config.source)
            config.token()
            policy_test = config.policy_test()
        except ConfigError as error:
            emit("reload_refused", error=str(error))
            return
        self.config, self.policy_test = config, policy_test
        for warning in warnings(config):
            emit("warning", message=warning)
        if self.agent is None:  # not connected yet: it will use the new one
            emit("reloaded", reconnecting=False)
            return
        address = (config.url, config.token())
        # What it says of itself (what it acts on) is told at login: a change logs in again.
        moved = (*address, self._about()) != (self.agent.url, self.agent.token, self.agent.about)
        emit("reloaded", reconnecting=moved)
        if moved:
            self.agent.url, self.agent.token = address
            self.agent.about = self._about()
        work = self._reconnect() if moved else self._state_again()
        self._reloading = asyncio.ensure_future(work)

    async def _reconnect(self) -> None:
        await self.agent.close()

    def _about(self) -> dict:
        """What the agent says of itself as it logs in (the console shows it)."""
        return {"software": f"sn-agent {__version__}", "acts_on": self.config.acts_on}

    def _own_attributes(self) -> dict:
        """What this server states of itself: static values and the last measurements."""
        return {**self.config.attributes, **self.measured}

    async def _state_again(self) -> None:
        with contextlib.suppress(*LOST):
            await self.on_connect()

    # Connection -----------------------------------------------------------------------

    async def on_connect(self) -> None:
        """After each login: state every attribute, the policy, and send the answers
        the console may not have."""
        welcome = self.agent.welcome or {}
        emit("connected", client=welcome.get("client"), position=self.agent.position)
        self.journal.set_fact("connected", True)
        self.journal.set_fact("connected_at", time.time())
        own = self._own_attributes()
        if own:  # an agent that states nothing has nothing to advertise
            await self._state("advertise", own)
        policy = self.config.policy()
        if policy is not None:
            await self._state("policy", policy)
        for entry in self.journal.unanswered():
            await self._answer(entry.position, entry.delivery, entry.status, entry.result)

    async def _state(self, what: str, value) -> None:
        """Advertise the model or set the policy. A refusal is the configuration's
        fault (a value of the wrong type, an attribute not this client's to state): it
        is said, and the agent goes on serving; a server failure is tried again."""
        request = self.agent.advertise if what == "advertise" else self.agent.set_policy
        try:
            await request(value)
        except AgentError as error:
            if error.code == "internal":
                raise
            emit(f"{what}_refused", error=str(error), field=error.field)

    async def _answer(self, position: int, delivery: int, status: str, result: dict) -> None:
        """Send an answer; written down as answered once the console has it (or has
        refused it for good). A lost connection leaves it for the next login."""
        try:
            await self.agent.ack(delivery, status, result)
        except AgentError as error:
            if error.code == "internal":
                return
            emit("answer_refused", delivery=delivery, error=str(error))
        except (ConnectionError, OSError, asyncio.TimeoutError):
            self.journal.set_fact("connected", False)
            return
        self.journal.answered(position)

    # Notifications --------------------------------------------------------------------

    async def handle(self, notification: Notification) -> None:
        """One notification, in position order: run its action, or only note it."""
        self.busy = True
        try:
            await self._handle(notification)
        finally:
            self.busy = False
            self.handled += 1
            if self.handled % PRUNE_EVERY == 0:
                self.journal.prune()
            if self.stopping and self._main is not None:
                self._main.cancel()

    async def _handle(self, notification: Notification) -> None:
        content = notification.content if isinstance(notification.content, dict) else {}
        name = content.get("action")
        emit("notification", **_described(notification), action=name)
        checked = self._checked(notification, content, asks_action=name is not None)
        self.remember_until = checked.remember_until
        if checked.refusal is not None:
            emit("refused", position=notification.position, reason=checked.refusal)
            self._started(notification, name if isinstance(name, str) else None)
            await self._settle(notification.position, notification.delivery,
                               actions.refused(f"not acted on: {checked.refusal}"))  # fmt: skip
            return
        if name is None:
            await self._note(notification)
            return
        action = self.config.actions.get(name) if isinstance(name, str) else None
        if action is None:
            outcome = actions.not_configured()
            self._started(notification, str(name))
        else:
            outcome = await self._run_action(action, notification)
        await self._settle(notification.position, notification.delivery, outcome)

    def _checked(self, notification: Notification, content: dict, *, asks_action: bool) -> Checked:
        """Whether this notification may be acted on, and until when its event is
        remembered. With [trust], its sender's signature and attestations must hold
        (docs/security.md): what the console's database or Redis says is not enough.
        Without, no action runs unless the configuration accepts unsigned events."""
        earlier = self.journal.earlier_position_of(notification.event, notification.position)
        if earlier is not None:
            said = f"event {notification.event} was handed over before, at position {earlier}"
            return Checked(said)
        if self.config.acts_on == ACTS_ON_NOTHING:  # it never acts: nothing to remember
            return Checked(NOTHING_VERIFIED if asks_action else None)
        if not self.config.verifies:
            return Checked(None, remember_until=time.time() + UNSIGNED_MEMORY_S)
        try:
            verified = self._verified(notification, content)
        except signatures.SealRefused as error:
            return Checked(str(error))  # never held: nothing to remember it by
        until = verified.signed_at + verified.lifetime_s + signatures.CLOCK_SKEW_S
        return Checked(self._disagreement(verified, content), remember_until=until)

    def _verified(self, notification: Notification, content: dict) -> signatures.Verified:
        return signatures.verify_seal(
            notification.seal,
            event_id=notification.event,
            content=content,
            channel=notification.channel,
            authorities=self.config.authorities,
            now=time.time(),
        )

    def _disagreement(self, verified: signatures.Verified, content: dict) -> Optional[str]:
        """Whether the event's selector and this server's policy agree, as the agent
        reads them (sn_agent.expressions). A selector that names what authorities
        attest of this server, which it does not know, is not held against it."""
        try:
            selects = expressions.selector_test(verified.selector)
        except expressions.ExpressionError as error:
            return f"its selector does not parse here: {error}"
        if selects({"receiver": expressions.Partly(self._own_attributes())}) is False:
            return f"its selector does not select this server: {verified.selector[:200]}"
        scopes = {"sender": verified.sender_attributes, "event": content}
        if not self.policy_test(scopes):
            return f"this server's policy does not accept it from {verified.sender}"
        return self._older_than_the_journal(verified, selects)

    def _older_than_the_journal(self, verified: signatures.Verified, selects) -> Optional[str]:
        """An event signed before this journal began may have been acted on under an
        earlier one (a wiped state folder): refused, unless it is standing (it has a
        selector) and this server did not match it when the journal began, so that
        it can only be coming to it now (docs/security.md, "Replays")."""
        since = self.journal.memory_since()
        if verified.signed_at >= int(since):  # signing times are whole seconds
            return None
        signed, began = _utc(verified.signed_at), _utc(since)
        why = f"it was signed at {signed}, before this agent's journal began at {began}"
        if not verified.selector:
            return f"{why}; {EARLIER_JOURNAL}"
        then = self.journal.attributes_since()
        if then is None or selects({"receiver": expressions.Partly(then)}) is not False:
            return f"{why}, and this server may have matched it then: {EARLIER_JOURNAL}"
        return None

    async def _note(self, notification: Notification) -> None:
        """A notification that asks for no action (an alert): written down, and
        answered `ok` if the configuration says so."""
        if not self.config.answer_without_action:
            self.journal.note(
                notification, action=None, state="noted", remember_until=self.remember_until
            )
            return
        self._started(notification, None)
        await self._settle(notification.position, notification.delivery, NOTED)

    async def _run_action(self, action, notification: Notification) -> actions.Outcome:
        files = actions.RunFiles(self.config.state_dir, notification.position)
        try:
            gated = await actions.start(action, notification, files)
        except (OSError, KeyError, ValueError) as error:  # no such program, user, folder
            self._started(notification, action.name)
            return actions.refused(f"could not start: {error}")
        self._started(notification, action.name)
        gated.open()
        emit("action_started", action=action.name, position=notification.position)
        return await gated.outcome(action)

    def _started(self, notification: Notification, action: Optional[str]) -> None:
        """Write the delivery down as started: from now on, a restart settles it (and
        its event is remembered for as long as it could be acted on)."""
        self.journal.note(
            notification, action=action, state="started", boot=self.boot,
            remember_until=self.remember_until,
        )  # fmt: skip

    async def _settle(self, position: int, delivery: int, outcome: actions.Outcome) -> None:
        self.journal.finish(position, outcome.status, outcome.result)
        actions.RunFiles(self.config.state_dir, position).remove()
        emit("answered", position=position, delivery=delivery, status=outcome.status,
             exit_code=outcome.result.get("exit_code"))  # fmt: skip
        await self._answer(position, delivery, outcome.status, outcome.result)

    # Recovery -------------------------------------------------------------------------

    async def recover(self) -> None:
        """Settle each delivery whose action a previous run started and did not see
        finish (docs/agent.md, "Exactly once"). Its answer goes at the next login."""
        for entry in self.journal.unfinished():
            files = actions.RunFiles(self.config.state_dir, entry.position)
            outcome = NOTED if entry.action is None else await self._outcome_of(entry, files)
            emit("recovered", position=entry.position, status=outcome.status)
            self.journal.finish(entry.position, outcome.status, outcome.result)
            files.remove()

    async def _outcome_of(self, entry, files: actions.RunFiles) -> actions.Outcome:
        action = self.config.actions.get(entry.action)
        outcome, cut_short = await actions.outcome_after_restart(
            action, files, started_at=entry.taken_at, same_boot=entry.boot == self.boot
        )
        return outcome or await self._again(entry, action, files, cut_short)

    async def _again(self, entry, action, files, cut_short: bool) -> actions.Outcome:
        """The action never ran (run it now), or was cut short (run it again only if
        it is idempotent)."""
        if action is None:
            return actions.not_configured()
        if cut_short and not action.idempotent:
            return actions.refused(RESTARTED_DURING_THE_ACTION)
        notification = files.read_notification()
        if notification is None:
            return actions.refused("its notification was lost from the state folder")
        gated = await actions.start(action, notification, files)
        gated.open()
        return await gated.outcome(action)

    # Providers --------------------------------------------------------------------------

    def _providers(self):
        return list(self.config.providers.values())

    async def _measure_all(self) -> None:
        for provider in self._providers():
            await self._measure(provider)

    async def _keep_measuring(self, provider) -> None:
        while True:
            await asyncio.sleep(provider.interval_s)
            provider = self.config.providers.get(provider.name, provider)
            if await self._measure(provider) and self.agent.connected:
                with contextlib.suppress(*LOST):
                    await self.agent.update({provider.name: self.measured[provider.name]})

    async def _measure(self, provider) -> bool:
        """Read `provider`; whether its value changed."""
        try:
            value = await providers.measure(provider)
        except providers.ProviderError as error:
            emit("provider_failed", attribute=provider.name, error=str(error))
            return False
        changed = self.measured.get(provider.name) != value
        self.measured[provider.name] = value
        return changed


@dataclasses.dataclass(frozen=True)
class Checked:
    """Why a notification must not be acted on (None: it may), and until when its
    event is remembered (None: not beyond the deliveries the journal keeps)."""

    refusal: Optional[str]
    remember_until: Optional[float] = None


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _described(notification: Notification) -> dict:
    return {
        "position": notification.position,
        "delivery": notification.delivery,
        "event_id": notification.event,
        "sender": notification.sender,
        "channel": notification.channel,
    }


def serve(config: Config) -> int:
    """Run one agent in this process until SIGTERM or SIGINT; SIGHUP reloads."""
    service = AgentService(config)
    loop = asyncio.new_event_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, service.stop)
    loop.add_signal_handler(signal.SIGHUP, service.reload)
    try:
        loop.run_until_complete(service.run())
    finally:
        loop.close()
    return 0
