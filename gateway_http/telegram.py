"""The Telegram channel: one adapter per ``[channels.NAME] kind = "telegram"``, run in
the gateway process, where chat bindings and memberships live.

- Notifications: the notifier delivers them here with its signed webhook contract and
  durable retries; the adapter sends them with sendMessage to every chat (thread) bound
  to the session, and answers 429 with the Bot API's retry_after so the notifier waits.
- Updates, by long polling (getUpdates): ``/task_question …`` commands run as chat
  commands of the chat's bound session, for the sender ``tg:<user id>`` when a member;
  ``/tasks`` opens the chat's live task menu (private chats only).
- A live menu refreshes every ``menu_refresh_ms`` (3 s), edits only when the text it
  shows changes, waits out a 429's retry_after, and stops on its Dismiss button, when
  the chat's binding moves to another session, when the sender is no longer a member,
  or when the message is gone. It shows only what the task snapshots say.

The Bot API client is python-telegram-bot's ``Bot`` (httpx underneath, nothing else).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.error import BadRequest, RetryAfter, TelegramError

from gateway_http.backends import Backends
from gateway_http.errors import ApiError
from gateway_http.store import GatewayStore
from libs.settings import ChannelConfig
from taskgate.scheduler.v1 import scheduler_pb2 as spb

log = structlog.get_logger("gateway_http.telegram")

DISMISS = "menu:dismiss"
KEYBOARD = InlineKeyboardMarkup([[InlineKeyboardButton("Dismiss", callback_data=DISMISS)]])
MAX_MESSAGE = 4096  # Telegram's limit on a message's text
Metadata = tuple[tuple[str, str], ...]
CommandRunner = Callable[[str, str, str, str], Awaitable[dict[str, Any]]]


def principal_of(user_id: int) -> str:
    return f"tg:{user_id}"


def seconds(value: int | dt.timedelta) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def state_name(state: int) -> str:
    return spb.TaskState.Name(state).removeprefix("TASK_STATE_").lower()


def render_menu(session_id: str, tasks: list[spb.Task], total: int) -> str:
    """The menu's text, from the task snapshots alone (nothing inferred)."""
    if not tasks:
        return f"Tasks of {session_id}: none active."
    lines = [f"Tasks of {session_id} ({total} active):"]
    for t in tasks:
        lines.append(f"\n• {t.title} — {state_name(t.state)}")
        if t.progress.text:
            lines.append(f"  {t.progress.text[:300]}")
        if t.pending_question.question_id:
            lines.append(f"  asks ({t.pending_question.question_id}): {t.pending_question.text[:300]}")
    return "\n".join(lines)[:MAX_MESSAGE]


@dataclass
class Menu:
    chat_id: int
    message_id: int
    agent_id: str
    session_id: str
    principal: str
    shown: str
    edits: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class TelegramAdapter:
    def __init__(
        self,
        name: str,
        channel: ChannelConfig,
        store: GatewayStore,
        backends: Backends,
        run_command: CommandRunner,
        bot: Bot | None = None,
    ) -> None:
        assert channel.bot_token is not None
        self.name = name
        self.channel = channel
        self.store = store
        self.backends = backends
        self.run_command = run_command
        self.bot = bot or Bot(channel.bot_token.get_secret_value(), base_url=channel.api_base_url.rstrip("/") + "/bot")
        self.refresh_s = channel.menu_refresh_ms / 1000
        self.menus: dict[int, Menu] = {}
        self._offset = 0

    # --- notifications (from the notifier) ---------------------------------------------

    async def deliver(self, doc: dict[str, Any]) -> tuple[int, float | None]:
        """Send one notification to the session's bound chats: (HTTP status for the notifier, retry_after)."""
        chats = await self.store.chats_of(self.name, doc["agentId"], doc["sessionId"])
        for chat_id, thread_id in chats:
            try:
                await self.bot.send_message(
                    chat_id=chat_id,
                    text=doc["text"][:MAX_MESSAGE],
                    message_thread_id=int(thread_id) if thread_id else None,
                )
            except RetryAfter as exc:
                return 429, seconds(exc.retry_after)
            except TelegramError as exc:
                log.warning("telegram_send_failed", channel=self.name, error=type(exc).__name__)
                return 502, None
        if not chats:
            log.warning("telegram_no_bound_chat", channel=self.name, session_id=doc["sessionId"])
        return 200, None

    # --- updates ---------------------------------------------------------------------

    async def run(self) -> None:
        await self.bot.initialize()
        log.info("telegram_polling", channel=self.name)
        try:
            while True:
                try:
                    updates = await self.bot.get_updates(
                        offset=self._offset,
                        timeout=self.channel.poll_timeout_s,
                        allowed_updates=["message", "callback_query"],
                    )
                except RetryAfter as exc:
                    await asyncio.sleep(seconds(exc.retry_after))
                    continue
                except TelegramError as exc:
                    log.warning("telegram_poll_failed", channel=self.name, error=type(exc).__name__)
                    await asyncio.sleep(1.0)
                    continue
                for update in updates:
                    self._offset = update.update_id + 1
                    try:
                        await self.handle(update)
                    except Exception:  # noqa: BLE001 - one bad update must not stop the bot
                        log.exception("telegram_update_failed", channel=self.name, update_id=update.update_id)
        finally:
            for menu in list(self.menus.values()):
                if menu.task is not None:
                    menu.task.cancel()
            with contextlib.suppress(Exception):
                await self.bot.shutdown()

    async def handle(self, update: Update) -> None:
        if update.callback_query is not None:
            await self._callback(update)
            return
        message = update.message
        if message is None or message.text is None or message.from_user is None:
            return
        text = message.text.strip()
        chat_id = message.chat.id
        thread = str(message.message_thread_id) if message.message_thread_id else ""
        principal = principal_of(message.from_user.id)
        word = text.split(None, 1)[0].split("@", 1)[0] if text else ""
        if word == "/tasks":
            await self._open_menu(chat_id, message.chat.type, principal)
        elif word == "/task_question":
            reply = await self._command(chat_id, thread, principal, text)
            await self._say(chat_id, thread, reply)
        # Anything else is an ordinary message: never an answer.

    async def _say(self, chat_id: int, thread: str, text: str) -> None:
        with contextlib.suppress(TelegramError):
            await self.bot.send_message(chat_id=chat_id, text=text, message_thread_id=int(thread) if thread else None)

    async def _authorized(self, chat_id: int, thread: str, principal: str) -> tuple[str, str] | str:
        bound = await self.store.binding(self.name, str(chat_id), thread)
        if bound is None:
            return "This chat is not bound to a session."
        if not await self.store.member(bound[0], bound[1], principal):
            return f"{principal} is not a member of this chat's session."
        return bound

    async def _command(self, chat_id: int, thread: str, principal: str, text: str) -> str:
        bound = await self._authorized(chat_id, thread, principal)
        if isinstance(bound, str):
            return bound
        try:
            done = await self.run_command(bound[0], bound[1], principal, text)
        except ApiError as exc:
            return f"Not done: {exc.message}"
        return str(done["reply"])

    # --- live task menus ---------------------------------------------------------------

    async def _render(self, agent_id: str, session_id: str) -> str:
        reply = await self.backends.scheduler.ListTasks(
            spb.ListTasksRequest(agent_id=agent_id, session_id=session_id, page=0, page_size=10, preview_chars=300),
            timeout=self.backends.timeout_s,
        )
        return render_menu(session_id, list(reply.tasks), reply.total)

    async def _open_menu(self, chat_id: int, chat_type: str, principal: str) -> None:
        if chat_type != "private":
            await self._say(chat_id, "", "The /tasks menu works in a private chat with the bot.")
            return
        bound = await self._authorized(chat_id, "", principal)
        if isinstance(bound, str):
            await self._say(chat_id, "", bound)
            return
        old = self.menus.pop(chat_id, None)
        if old is not None:
            # One live menu per chat: the new one replaces it.
            if old.task is not None:
                old.task.cancel()
            with contextlib.suppress(TelegramError):
                await self.bot.delete_message(chat_id=chat_id, message_id=old.message_id)
        text = await self._render(*bound)
        sent = await self.bot.send_message(chat_id=chat_id, text=text, reply_markup=KEYBOARD)
        menu = Menu(chat_id, sent.message_id, bound[0], bound[1], principal, text)
        self.menus[chat_id] = menu
        menu.task = asyncio.create_task(self._refresh(menu), name=f"tg-menu-{chat_id}")
        log.info("telegram_menu_opened", channel=self.name, chat_id=chat_id, session_id=bound[1])

    async def _refresh(self, menu: Menu) -> None:
        reason = "cancelled"
        try:
            while True:
                await asyncio.sleep(self.refresh_s)
                bound = await self.store.binding(self.name, str(menu.chat_id), "")
                if bound != (menu.agent_id, menu.session_id):
                    reason = "session_changed"
                    await self._close(menu, "Menu closed: this chat's session changed.")
                    return
                if not await self.store.member(menu.agent_id, menu.session_id, menu.principal):
                    reason = "access_revoked"
                    await self._close(menu, "Menu closed: access revoked.")
                    return
                text = await self._render(menu.agent_id, menu.session_id)
                if text == menu.shown:
                    continue
                try:
                    await self.bot.edit_message_text(
                        text=text, chat_id=menu.chat_id, message_id=menu.message_id, reply_markup=KEYBOARD
                    )
                except RetryAfter as exc:
                    # Telegram asked us to wait: no edit before then; the change is shown after.
                    await asyncio.sleep(seconds(exc.retry_after))
                    continue
                except BadRequest as exc:
                    if "not modified" in exc.message.lower():
                        menu.shown = text
                        continue
                    reason = "message_gone"
                    return
                menu.shown = text
                menu.edits += 1
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a backend hiccup ends this menu, not the bot
            reason = "failed"
            log.exception("telegram_menu_failed", channel=self.name, chat_id=menu.chat_id)
        finally:
            if self.menus.get(menu.chat_id) is menu:
                del self.menus[menu.chat_id]
            log.info("telegram_menu_stopped", channel=self.name, chat_id=menu.chat_id, reason=reason, edits=menu.edits)

    async def _close(self, menu: Menu, text: str) -> None:
        with contextlib.suppress(TelegramError):
            await self.bot.edit_message_text(text=text, chat_id=menu.chat_id, message_id=menu.message_id)

    async def _callback(self, update: Update) -> None:
        query = update.callback_query
        assert query is not None
        with contextlib.suppress(TelegramError):
            await query.answer()
        message = query.message
        if query.data != DISMISS or message is None:
            return
        menu = self.menus.get(message.chat.id)
        if menu is None or menu.message_id != message.message_id:
            return
        del self.menus[menu.chat_id]
        if menu.task is not None:
            menu.task.cancel()
        await self._close(menu, "Menu closed.")
        log.info("telegram_menu_dismissed", channel=self.name, chat_id=menu.chat_id)
