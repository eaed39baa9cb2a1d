"""ChatController: the one object every handler of the chat UI reads and writes through.

It composes the features' plain-Python parts, giving each what it needs (the turn registry, the
store, the backend provider, the settings reader) and holding none of their state itself:

  turn_registry.TurnRegistry        the running turn of each conversation, stop, stop all
  settings.logic.ConversationSettings  system prompt and sampling settings, checked on write
  settings.presets.Presets          system-prompt presets, the defaults of new conversations
  prepared.logic.PreparedReplies    alternatives prepared in the background
  context.logic.ContextFeatures     context policy, the gauge's numbers, Continue
  context.compact.Compaction        Compact: a summary and the recent turns in a new branch
  chat.logic.ChatTurns              send, regenerate, edit (and the request compare makes)
  compare.logic.CompareTurns        compare: samples, settings per column, beams
  edit_preview.logic.edit_cost      reused / prefilled tokens of an edit
  tabs.logic.OpenTabsFile           the open tabs, remembered across restarts
  sidebar.logic.Organiser           the list's query, search hits, pin, archive, tags, import
  delete_branch.logic.BranchDeletion  delete a message and its branch (stopping what writes there)
  tools.logic.ToolFeatures          MCP servers, a conversation's tools and JSON schema, approvals
  tokens.logic.TokenBranches        a reply token by token, and a branch at any token

and holds the operations every feature shares: conversations (new, rename, delete, search,
export) and the message tree (the view a tab shows, branches, switch, pick, fork). It returns
store rows and Turns, never Gradio objects, so it is tested without a browser.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localpaged.chat.backend import ChatBackend
from localpaged.core.sampling_params import PruneRule

from .chat.logic import NEW_TITLE, ChatTurns
from .compare.logic import CompareTurns
from .context.compact import Compaction
from .context.logic import ContextAsk, ContextFeatures, ContextUsage, prompt_messages
from .delete_branch.logic import BranchDeletion
from .edit_preview.logic import edit_cost
from .prepared.logic import PreparedReplies
from .settings.logic import ConversationSettings, Sampling
from .settings.presets import Defaults, Presets
from .sidebar.logic import Organiser
from .store import Conversation, Message, Store
from .tabs.logic import OpenTabsFile
from .tools.logic import ToolFeatures
from .tokens.logic import TokenBranches, TokenView
from .tools.mcp_client import McpClient
from .turn_registry import TurnRegistry
from .live_reply import LiveReply
from .turns import ChatError, Turn


@dataclass
class View:
    """What a chat tab shows: the active path, each message's (position, count) among its
    siblings, and the live replies of a running turn (by message id)."""
    conversation: Conversation
    path: list[Message]
    siblings: list[tuple[int, int]]
    live: dict[int, LiveReply]
    busy: bool


@dataclass
class Branch:
    """One root-to-leaf path of a conversation's tree; `active` when it is the path shown."""
    leaf_id: int
    path: list[Message]
    active: bool


class ChatController:
    def __init__(self, store: Store, backend: Callable[[], ChatBackend | None],
                 default_sampling: dict[str, Any] | None = None,
                 state_file: str | Path | None = None,
                 tool_client: McpClient | None = None) -> None:
        self.store = store
        self._backend = backend
        self.turns = TurnRegistry()
        self.conversation_settings = ConversationSettings(store, default_sampling)
        self.presets = Presets(store, self.conversation_settings.default)
        parts = (self.turns, store, backend, self.conversation_settings)
        self.prepared = PreparedReplies(*parts)
        self.context = ContextFeatures(*parts)
        self.compaction = Compaction(*parts)
        self.tools = ToolFeatures(store, self.turns, tool_client)
        self.chat = ChatTurns(*parts, self.prepared, self.tools, self.compaction)
        self.compares = CompareTurns(self.turns, backend, self.conversation_settings, self.chat)
        self._open_tabs = OpenTabsFile(state_file)
        self.organise = Organiser(store)
        self.branch_deletion = BranchDeletion(self.turns, store, self.prepared)
        self.token_branches = TokenBranches(self.turns, store, backend, self.continue_reply)

    def backend(self) -> ChatBackend | None:
        return self._backend()

    # ---- conversations --------------------------------------------------------------------
    def new_conversation(self, title: str = NEW_TITLE) -> Conversation:
        """A new conversation with the defaults (settings/presets.py: saved, else the app's)."""
        d = self.presets.defaults()
        conv = self.store.create_conversation(title.strip() or NEW_TITLE, d.system_prompt,
                                              sampling=d.sampling)
        if d.context_policy != conv.context_policy:
            conv = self.store.update_conversation(conv.id, context_policy=d.context_policy)
        return conv

    def rename(self, cid: int, title: str) -> Conversation:
        if not title.strip():
            raise ChatError("a title cannot be empty")
        return self.store.rename_conversation(cid, title.strip()[:200])

    def delete(self, cid: int) -> bool:
        self.stop(cid)
        self.prepared.cancel(cid, moving_on=False)
        return self.store.delete_conversation(cid)

    def search(self, query: str | dict = "") -> list[Conversation]:
        """The sidebar's list: a search string, or the page's query (sidebar/logic.py)."""
        return self.organise.listing(query)

    def conversation(self, cid: int) -> Conversation:
        return self.store.get_conversation(cid)

    def export(self, cid: int, fmt: str = "markdown") -> str:
        if fmt == "json":
            return json.dumps(self.store.export_json(cid), indent=2, ensure_ascii=False)
        return self.store.export_markdown(cid)

    # ---- settings (settings/logic.py) -------------------------------------------------------
    def settings(self, cid: int) -> tuple[str, dict[str, Any]]:
        return self.conversation_settings.read(cid)

    def update_settings(self, cid: int, system_prompt: str, sampling: dict[str, Any]) -> Sampling:
        """Raises ValueError naming a bad field; nothing is saved then. Returns the sampling
        settings checked: pass them to the send that follows, which then builds nothing."""
        return self.conversation_settings.update(cid, system_prompt, sampling)

    def update_setting(self, cid: int, key: str, value: Any) -> Sampling:
        """One field edited ("system_prompt" or a sampling key), merged into what is stored."""
        return self.conversation_settings.update_one(cid, key, value)

    # ---- presets and the defaults of new conversations (settings/presets.py) --------------
    def preset_names(self) -> list[str]:
        return self.presets.names()

    def apply_preset(self, cid: int, name: str) -> str:
        """Conversation cid takes preset `name`'s system prompt (saved); returns it."""
        prompt = self.presets.prompt(name)
        self.update_setting(cid, "system_prompt", prompt)
        return prompt

    def save_preset(self, name: str, system_prompt: str) -> str:
        return self.presets.save(name, system_prompt)

    def save_defaults(self, cid: int) -> Defaults:
        """Conversation cid's settings (as saved) become the defaults of new conversations."""
        system_prompt, sampling = self.settings(cid)
        return self.presets.save_defaults(system_prompt, sampling,
                                          self.conversation(cid).context_policy)

    # ---- the tree ---------------------------------------------------------------------------
    def view(self, cid: int) -> View:
        path = self.store.active_path(cid)
        sib = []
        for m in path:
            ids, index = self.prepared.visible_siblings(m.id)
            sib.append((index + 1, len(ids)))
        turn = self.turn(cid)
        live = {r.message_id: r for r in turn.replies} if turn and not turn.done else {}
        return View(self.store.get_conversation(cid), path, sib, live, bool(live))

    def message(self, message_id: int) -> Message:
        return self.store.get_message(message_id)

    def message_at(self, cid: int, index: int | None) -> Message:
        """The message at `index` on the shown path (the last one for None or past the end)."""
        path = self.store.active_path(cid)
        if not path:
            raise ChatError("there is no message yet")
        return path[-1 if index is None or index >= len(path) else index]

    def branches(self, cid: int) -> tuple[Conversation, list[Branch]]:
        """Every root-to-leaf path: the shown one first, then newest leaf first."""
        msgs = {m.id: m for m in self.store.messages(cid)}
        parents = {m.parent_id for m in msgs.values()}
        shown = self.store.active_path(cid)
        shown_leaf = shown[-1].id if shown else None
        leaves = sorted((i for i in msgs if i not in parents), key=lambda i: (i != shown_leaf, -i))
        out = []
        for leaf in leaves:
            path, cur = [], msgs.get(leaf)
            while cur is not None:
                path.append(cur)
                cur = msgs.get(cur.parent_id)
            out.append(Branch(leaf, path[::-1], leaf == shown_leaf))
        return self.store.get_conversation(cid), out

    def switch(self, message_id: int, step: int) -> list[Message]:
        """Show the sibling `step` places after (or before) this message, wrapping round (a
        prepared reply among them is now seen)."""
        ids, index = self.prepared.visible_siblings(message_id)
        self.prepared.opened(ids[(index + step) % len(ids)])
        return self.store.active_path(self.store.get_message(message_id).conversation_id)

    def pick(self, message_id: int) -> list[Message]:
        """Continue with this reply (a compare column): it becomes the active branch."""
        return self.store.set_active(message_id)

    def fork(self, message_id: int) -> Conversation:
        """A new conversation holding the path down to this message; its title starts with
        ⎇ (visible even in a shortened tab label)."""
        src = self.store.get_conversation(self.store.get_message(message_id).conversation_id)
        return self.store.fork_conversation(message_id, title=f"⎇ {src.title}")

    def prompt_messages(self, cid: int, last_id: int | None) -> list[dict[str, str]]:
        """The engine's chat messages: the system prompt, then the path down to last_id."""
        return prompt_messages(self.store, cid, last_id)

    # ---- turns: `sampling` is what update_settings returned (default: the stored settings) --
    def turn(self, cid: int) -> Turn | None:
        return self.turns.turn(cid)

    def busy(self, cid: int) -> bool:
        return self.turns.busy(cid)

    def send(self, cid: int, text: str, sampling: Sampling | None = None,
             policy: str | None = None, attachments: list[dict] | None = None) -> Turn:
        """`policy`: this request's context policy (default: the conversation's); under
        "compact", a message that would not fit is sent on a compacted branch: the turn
        returned streams the summary, then hands on to the reply (`Turn.then`, `Turn.final`);
        `attachments`: files' text sent with the message (tools/messages.py)."""
        return self.chat.send(cid, text, sampling, policy, attachments)

    def regenerate(self, message_id: int, sampling: Sampling | None = None,
                   policy: str | None = None) -> Turn:
        return self.chat.regenerate(message_id, sampling, policy)

    def edit(self, message_id: int, text: str, sampling: Sampling | None = None,
             policy: str | None = None, images: list[str] | None = None) -> Turn:
        """`images`: the sha256 of the original's images the new version keeps (None: all)."""
        return self.chat.edit(message_id, text, sampling, policy, images)

    def continue_reply(self, message_id: int, sampling: Sampling | None = None) -> Turn:
        return self.context.continue_reply(message_id, sampling)

    def reply_tokens(self, message_id: int) -> list[TokenView] | None:
        return self.token_branches.tokens(message_id)

    def branch_at_token(self, message_id: int, index: int, token_id: int,
                        sampling: Sampling | None = None) -> Turn:
        return self.token_branches.branch(message_id, index, token_id, sampling)

    def compare(self, cid: int, text: str, columns: list[dict[str, Any]] | int) -> Turn:
        return self.compares.compare(cid, text, columns)

    def compare_beams(self, cid: int, text: str, width: int) -> Turn:
        return self.compares.compare_beams(cid, text, width)

    def think(self, cid: int, text: str, k: int, rule: PruneRule) -> Turn:
        return self.compares.think(cid, text, k, rule)

    def stop(self, cid: int) -> bool:
        return self.turns.stop(cid)

    def stop_all(self, wait: float = 0.0) -> None:
        """Stop every running turn (background ones too); with `wait`, give them that long to
        save their text."""
        self.turns.stop_all(wait)

    # ---- context (context/logic.py) and the edit preview ------------------------------------
    def set_context_policy(self, cid: int, policy: str) -> Conversation:
        return self.context.set_policy(cid, policy)

    def compact(self, cid: int, sampling: Sampling | None = None) -> Turn:
        """A new branch: the system prompt, the model's summary of the oldest turns and copies
        of the recent ones (context/compact.py); the original path stays. The turn streams the
        summary (Stop cancels it: nothing is kept) and makes the branch, active, when done."""
        return self.compaction.start(cid, sampling=sampling)

    def compact_prompt(self, cid: int) -> str:
        return self.compaction.prompt(cid)

    def set_compact_prompt(self, cid: int, text: str) -> str:
        return self.compaction.set_prompt(cid, text)

    def context_usage(self, cid: int, draft: str = "", system_prompt: str | None = None,
                      max_tokens: int | None = None) -> ContextUsage | None:
        return self.context.usage(cid, draft, system_prompt, max_tokens)

    def edit_cost(self, message_id: int, text: str) -> tuple[int, int] | None:
        return edit_cost(self.store, self.backend(), message_id, text)

    # ---- open tabs, remembered across reloads and restarts (tabs/logic.py) ------------------
    def open_tabs(self) -> list[int]:
        alive = {c.id for c in self.store.list_conversations()}
        return [c for c in self._open_tabs.read() if c in alive]

    def current_tab(self) -> int | None:
        """The conversation whose tab was selected last, if it is still open (and exists: one
        lookup by id, not the whole list, as a streaming reply asks 10-20 times a second)."""
        cid = self._open_tabs.read_current()
        if cid is None or cid not in self._open_tabs.read():
            return None
        try:
            self.store.get_conversation(cid)
        except KeyError:
            return None
        return cid

    def save_open_tabs(self, cids: list[int], current: int | None = None) -> None:
        self._open_tabs.write(cids, current)
