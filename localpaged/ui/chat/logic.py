"""A chat tab's turns, in plain Python: send, regenerate and edit, each a `Turn` in the registry
(at most one per conversation), and `generate`, the one way a reply is asked for (compare uses
it too). Every request is fitted to the model's context first (the conversation's policy, see
`context/logic.py`): a message that cannot be sent is not stored, and a reply records how many
older messages it left out. Under policy "compact", a send, regenerate or edit whose request
would not fit compacts first (`context/compact.py`): one turn streams the summary, makes the
new branch and hands on to the reply there (the regenerated message copied onto it, the edited
one new). A user message's images (ui/images/logic.py) go with it: stored with it once the
request is known to fit, kept by a regenerate (they are on the message) and by an edit (the
original's, unless the edit names others); a reply whose images the prefix cache served says
so (`images_from_cache` in its stats). The sampling params come ready-made: a tab's send passes those its
fields were checked into; without them, the conversation's stored settings make them.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

from localpaged.chat.backend import ChatBackend, reasoning_of, with_thinking
from localpaged.core.sampling_params import (MAX_DRAFT_SOURCE_TOKENS, MAX_DRAFT_SOURCES,
                                             SamplingParams)

from ..context.compact import Compaction
from ..images.logic import Pending, split_attachments
from ..context.logic import fit_prompt, prompt_messages
from ..tools.messages import message_dict
from ..prepared.logic import PreparedReplies
from ..settings.logic import ConversationSettings, Sampling, sampling_record
from ..store import Message, Store
from ..store.images import ImageFile, image_refs
from ..tools.logic import ToolFeatures
from ..tools.turn import ToolTurn, open_stream
from ..turn_registry import TurnRegistry
from ..live_reply import LiveReply
from ..turns import ChatError, Turn

NEW_TITLE = "New chat"


class ChatTurns:
    def __init__(self, turns: TurnRegistry, store: Store,
                 backend: Callable[[], ChatBackend | None], settings: ConversationSettings,
                 prepared: PreparedReplies, tools: ToolFeatures | None = None,
                 compaction: Compaction | None = None) -> None:
        self.turns, self.store, self.backend, self.settings = turns, store, backend, settings
        self.prepared, self.tools, self.compaction = prepared, tools, compaction

    def params(self, cid: int, sampling: Sampling | None, k: int = 1) -> list[SamplingParams]:
        """The params of k replies: from `sampling` (checked already) or the stored settings."""
        return (sampling or self.settings.sampling(cid)).columns(k)

    def send(self, cid: int, text: str, sampling: Sampling | None = None,
             policy: str | None = None, attachments: list[dict] | None = None) -> Turn:
        """Add the user's message at the end of the shown path and answer it. With empty text,
        answer the last message if it is the user's (a reply that failed before). `policy`
        overrides the conversation's context policy for this request only (the "Stop and ask
        me" dialog's "drop the oldest"). Under policy "error", a conversation that no longer
        fits raises ContextAsk (context/logic.py) when dropping would help. `attachments`
        ({"name", "kind", "text"}, or an image: tools/messages.py) go with the new message."""
        path = self.store.active_path(cid)
        attachments, images = split_attachments(attachments)
        if not text.strip() and (attachments or images):
            text = "(attached)"
        if not text.strip():
            if path and path[-1].role == "user":
                return self.generate(cid, path[-1].id, self.params(cid, sampling), policy=policy)
            raise ChatError("type a message first")
        params = self.params(cid, sampling)                   # bad settings: nothing written
        self.turns.check_idle(cid)
        extra = {"attachments": list(attachments)} if attachments else None
        parent = path[-1].id if path else None
        return (self._compacting(cid, parent, sampling, params, policy, text, extra, images)
                or self.generate(cid, parent, params, user_text=text, policy=policy,
                                 user_extra=extra, user_images=images))

    def regenerate(self, message_id: int, sampling: Sampling | None = None,
                   policy: str | None = None) -> Turn:
        """A new reply beside this one (the old one stays as a sibling); for a user message,
        a new reply to it. A reply prepared in the background is shown instead, at once, when
        there is one (no new request). `policy`: as send's. Under "compact", a user message
        whose prompt no longer fits is copied onto a compacted branch and answered there."""
        m = self.store.get_message(message_id)
        parent = m.id if m.role == "user" else m.parent_id
        if parent is None:
            raise ChatError("this reply has no user message to answer")
        cid = m.conversation_id
        self.turns.check_idle(cid)
        params = with_draft_sources(self.params(cid, sampling), self._replies_to(parent))
        user = m if m.id == parent else self.store.get_message(parent)
        if user.role == "user":
            compacting = self._compacting(cid, user.parent_id, sampling, params, policy,
                                          user.content, {**user.extra, "copy_of": user.id})
            if compacting is not None:
                return compacting
        ready = self.prepared.reveal(parent)
        return ready if ready is not None else self.generate(cid, parent, params, policy=policy)

    def edit(self, message_id: int, text: str, sampling: Sampling | None = None,
             policy: str | None = None, images: list[str] | None = None) -> Turn:
        """A new version of an earlier user message, answered: a new branch beside the old
        (under "compact", on a compacted branch when it no longer fits). `policy`: as send's.
        The new version keeps the original's images, or those of them whose sha256 `images`
        lists (in that order; [] for none)."""
        m = self.store.get_message(message_id)
        if m.role != "user":
            raise ChatError("only your own messages can be edited")
        if not text.strip():
            raise ChatError("the edited message is empty")
        cid = m.conversation_id
        params = with_draft_sources(self.params(cid, sampling), self._replies_to(m.id))
        self.turns.check_idle(cid)
        extra = _kept_images(m, images)
        return (self._compacting(cid, m.parent_id, sampling, params, policy, text, extra)
                or self.generate(cid, m.parent_id, params, user_text=text, policy=policy,
                                 user_extra=extra))

    def _compacting(self, cid: int, parent_id: int | None, sampling: Sampling | None,
                    params: list[SamplingParams], policy: str | None, user_text: str,
                    user_extra: dict | None = None,
                    user_images: list[ImageFile] | None = None) -> Turn | None:
        """Under policy "compact", when a new user message `user_text` under parent_id would
        not fit the context: the turn that compacts the path down to parent_id, then stores
        the message on the new branch and answers it (`then`). None otherwise."""
        if self.compaction is None or \
                (policy or self.store.get_conversation(cid).context_policy) != "compact":
            return None
        draft = self._user_message(cid, parent_id, user_text, user_extra, user_images)
        if not self.compaction.needed(cid, parent_id, draft, sampling):
            return None
        return self.compaction.start(
            cid, parent_id, draft, sampling,
            then=lambda backend, leaf: self._start(
                with_thinking(backend, self.settings.thinking(cid)), cid, leaf, params,
                user_text, user_extra=user_extra, user_images=user_images))

    def _replies_to(self, message_id: int) -> list[list[int]]:
        """Token ids of the stored replies to a message, newest first: what a new reply to the
        same prompt (a regenerate) or to an edited one is likely to repeat in part."""
        replies = [c for c in self.store.children(message_id)
                   if c.role == "assistant" and c.token_ids]
        return [c.token_ids[:MAX_DRAFT_SOURCE_TOKENS] for c in reversed(replies)]

    def generate(self, cid: int, parent_id: int | None, params: list[SamplingParams],
                 user_text: str | None = None, beam: int = 0, policy: str | None = None,
                 user_extra: dict | None = None,
                 user_images: list[ImageFile] | None = None) -> Turn:
        """One reply per params to `parent_id` (a beam search of width `beam` if set); with
        `user_text`, to a new user message under it, stored only once the request is known to
        fit the context (else ContextError, nothing stored). The registry cancels the
        conversation's background alternatives first (see prepared/logic.py)."""
        if user_text is not None and self.backend() is None:
            self._add_user(cid, parent_id, user_text, user_extra,   # kept: a later send answers it
                           user_images)
        backend = with_thinking(self.backend(), self.settings.thinking(cid))
        return self.turns.launch(cid, backend,
                                 lambda b: self._start(b, cid, parent_id, params, user_text, beam,
                                                       policy, user_extra, user_images))

    def _add_user(self, cid: int, parent_id: int | None, text: str,
                  extra: dict | None = None, images: list[ImageFile] | None = None) -> Message:
        if self.store.get_conversation(cid).title == NEW_TITLE:
            self.store.rename_conversation(cid, _title_from(text))
        return self.store.add_message(cid, parent_id, "user", text, extra=extra,
                                      images=images or ())

    def _user_message(self, cid: int, parent_id: int | None, text: str, extra: dict | None,
                      images: list[ImageFile] | None = None) -> dict:
        """The chat message a new user message will be, before it is stored (its images'
        pixels from `images`, else the store)."""
        if images:
            extra = {**(extra or {}), "images": [im.ref() for im in images]}
        return message_dict(Message(0, cid, parent_id, "user", text, 0.0, None, None,
                                    "complete", {}, extra=extra or {}),
                            Pending(images or (), self.store))

    def _start(self, backend: ChatBackend, cid: int, parent_id: int | None,
               params: list[SamplingParams], user_text: str | None, beam: int = 0,
               policy: str | None = None, user_extra: dict | None = None,
               user_images: list[ImageFile] | None = None) -> Turn:
        conv = self.store.get_conversation(cid)
        policy = policy or conv.context_policy
        plan = self.tools.plan(cid) if self.tools is not None and not beam else None
        if plan is not None:
            params = plan.constrain(params)             # the JSON schema, if any
        tooled = plan is not None and bool(plan.specs) and len(params) == 1
        prompt = prompt_messages(self.store, cid, parent_id)
        if user_text is not None:
            prompt.append(self._user_message(cid, parent_id, user_text, user_extra, user_images))
        sent = fit_prompt(backend, prompt, params[0].max_tokens, policy)
        image_prompt = getattr(backend, "image_prompt", None)
        images = image_prompt(sent.messages) if image_prompt is not None else None
        request_id = f"conv{cid}-{uuid.uuid4().hex[:8]}"
        if beam:                                        # ValueError: bad input
            stream = backend.beam_search(sent.messages, beam, params[0].max_tokens, request_id)
        else:
            stream = open_stream(backend, sent.messages, params, request_id,
                                 plan if tooled else None, plan.first if tooled else "auto")
        user = None
        try:
            if user_text is not None:
                user = self._add_user(cid, parent_id, user_text, user_extra, user_images)
                parent_id = user.id
            stats = {"context_dropped": sent.dropped} if sent.dropped else {}
            if getattr(backend, "model_name", None):          # the model that writes the reply
                stats["model"] = backend.model_name
            replies = [LiveReply(self.store.add_message(
                cid, parent_id, "assistant", "", sampling_record(p), status="streaming",
                stats=stats).id) for p in params]
            self.store.set_active(replies[0].message_id)
        except BaseException:
            backend.abort(request_id)
            if user is not None:
                self.store.delete_message(user.id)          # no orphan message
            raise
        if tooled:
            return ToolTurn(cid, request_id, replies[0], stream, backend, self.store, plan,
                            params, policy)
        after = self.prepared.after if len(params) == 1 and not beam else None
        return Turn(cid, request_id, replies, stream, backend.abort, self.store, on_done=after,
                    beam=bool(beam), reasoning=reasoning_of(backend), images=images)


def with_draft_sources(params: list[SamplingParams], sources: list[list[int]]) -> list[SamplingParams]:
    """params that speculative decoding may draft from `sources` (the engine's choice whether
    it speculates at all; a remote backend ignores them)."""
    if not sources:
        return params
    kept = tuple(tuple(src) for src in sources[:MAX_DRAFT_SOURCES])
    return [dataclasses.replace(p, draft_sources=kept) for p in params]


def _kept_images(m: Message, keep: list[str] | None) -> dict | None:
    """The `extra` an edit of user message m starts from: its images, or those `keep` names."""
    refs = {r["sha256"]: r for r in image_refs(m.extra)}
    if keep is not None:
        missing = [sha for sha in keep if sha not in refs]
        if missing:
            raise ChatError("an edit keeps only images the original message has")
        return {"images": [refs[sha] for sha in keep]} if keep else None
    return {"images": list(refs.values())} if refs else None


def _title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 48 else line[:47].rstrip() + "…"
