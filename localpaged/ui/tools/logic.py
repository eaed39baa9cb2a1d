"""Tools in the chat, in plain Python: the MCP servers the user added (`ToolFeatures.add_server`,
stored in the store's `tool_servers`), their tools (listed through `McpClient`, kept per server
until asked again), and per conversation (in `Conversation.options`): which servers it uses,
which tools run without asking, the step limit, whether the first step must call a tool, and
"reply as JSON matching this schema".

`plan(cid)` gathers what one turn needs into a `ToolPlan`: the ToolSpecs offered to the model,
which server answers each, the approvals, and the JSON-schema constraint. Nothing runs a server
except a turn's plan, and a plan only holds servers the conversation enabled.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
import threading
from dataclasses import dataclass, field
from typing import Any

from localpaged.chat.tool_calls import ToolCall, ToolSpec
from localpaged.core.guided import GuidedDecoding
from localpaged.core.sampling_params import SamplingParams

from ..store import Store, ToolServer
from ..turn_registry import TurnRegistry
from ..turns import ChatError
from .mcp_client import CALL_TIMEOUT_S, McpClient, McpTool, ToolError, ToolResult

log = logging.getLogger(__name__)

DEFAULT_MAX_STEPS = 3
MAX_STEPS = 20
FIRST_CHOICES = ("auto", "required")    # the first step: the model decides, or must call one


@dataclass
class ToolOptions:
    """A conversation's tool settings (options["tools"])."""
    servers: list[int] = field(default_factory=list)   # enabled server ids
    allowed: list[str] = field(default_factory=list)   # tools that run without asking
    max_steps: int = DEFAULT_MAX_STEPS                 # tool rounds in one turn
    first: str = "auto"                                # one of FIRST_CHOICES

    @classmethod
    def of(cls, raw: Any) -> "ToolOptions":
        """From stored options, anything unreadable at its default."""
        raw = raw if isinstance(raw, dict) else {}
        opts = cls()
        if isinstance(raw.get("servers"), list):
            opts.servers = [s for s in raw["servers"] if type(s) is int]
        if isinstance(raw.get("allowed"), list):
            opts.allowed = [t for t in raw["allowed"] if isinstance(t, str)]
        if type(raw.get("max_steps")) is int and 1 <= raw["max_steps"] <= MAX_STEPS:
            opts.max_steps = raw["max_steps"]
        if raw.get("first") in FIRST_CHOICES:
            opts.first = raw["first"]
        return opts


@dataclass
class ToolPlan:
    """What one turn of a conversation may do with tools."""
    specs: list[ToolSpec]
    servers: dict[str, ToolServer]            # tool name -> the server that answers it
    allowed: set[str]
    max_steps: int
    first: str
    guided: GuidedDecoding | None
    client: McpClient
    allow: Any = None                         # allow(name): "always allow" saved for the chat
    timeout: float = CALL_TIMEOUT_S

    def constrain(self, params: list[SamplingParams]) -> list[SamplingParams]:
        """params with the conversation's JSON schema, if it has one."""
        if self.guided is None:
            return params
        return [dataclasses.replace(p, guided=self.guided) for p in params]

    def run(self, call: ToolCall) -> ToolResult:
        """Run a call on its server (ToolError: unknown tool, bad arguments, server trouble)."""
        server = self.servers.get(call.name)
        if server is None:
            raise ToolError(f"there is no tool named {call.name!r} in this conversation")
        try:
            args = json.loads(call.arguments or "{}")
        except ValueError as exc:
            raise ToolError(f"the arguments are not JSON: {exc}") from None
        if not isinstance(args, dict):
            raise ToolError("the arguments are not a JSON object")
        return self.client.call_tool(server, call.name, args, timeout=self.timeout)


class ToolFeatures:
    def __init__(self, store: Store, turns: TurnRegistry, client: McpClient | None = None) -> None:
        self.store, self.turns = store, turns
        self.client = client or McpClient()
        self._tools: dict[int, list[McpTool]] = {}
        self._lock = threading.Lock()

    # ---- servers ----------------------------------------------------------------------------
    def add_server(self, name: str, command_or_url: str) -> ToolServer:
        """A server started by a command (split like a shell line, never run by one) or reached
        at an http(s) URL; its tools are listed once to check it answers (ToolError: it did
        not, and it is not kept). ValueError names bad input."""
        where = (command_or_url or "").strip()
        if not where:
            raise ValueError("give the command that starts the server, or its http(s) URL")
        if where.startswith(("http://", "https://")):
            server = self.store.add_tool_server(name, "http", where)
        else:
            try:
                argv = shlex.split(where)
            except ValueError as exc:
                raise ValueError(f"the command cannot be read: {exc}") from None
            server = self.store.add_tool_server(name, "stdio", argv)
        try:
            self.tools(server.id, refresh=True)
        except ToolError:
            self.store.delete_tool_server(server.id)
            raise
        return server

    def remove_server(self, server_id: int) -> None:
        self.store.delete_tool_server(server_id)
        with self._lock:
            self._tools.pop(server_id, None)

    def servers(self) -> list[ToolServer]:
        return self.store.tool_servers()

    def tools(self, server_id: int, refresh: bool = False) -> list[McpTool]:
        """The server's tools (listed once, then kept until `refresh`); ToolError if it does
        not answer."""
        with self._lock:
            known = self._tools.get(server_id)
        if known is not None and not refresh:
            return known
        listed = self.client.list_tools(self.store.tool_server(server_id))
        with self._lock:
            self._tools[server_id] = listed
        return listed

    # ---- a conversation's settings -------------------------------------------------------------
    def options(self, cid: int) -> ToolOptions:
        return ToolOptions.of(self.store.get_conversation(cid).options.get("tools"))

    def set_options(self, cid: int, **changes: Any) -> ToolOptions:
        """servers (ids of added servers), max_steps (1..MAX_STEPS), first (FIRST_CHOICES),
        allowed; ValueError naming a bad value, nothing saved then."""
        opts = dataclasses.replace(self.options(cid), **changes)
        known = {s.id for s in self.servers()}
        if any(s not in known for s in opts.servers):
            raise ValueError("only servers added in the Tools panel can be enabled")
        if type(opts.max_steps) is not int or not 1 <= opts.max_steps <= MAX_STEPS:
            raise ValueError(f"the step limit is a whole number from 1 to {MAX_STEPS}")
        if opts.first not in FIRST_CHOICES:
            raise ValueError(f"the first step's tool choice is one of {list(FIRST_CHOICES)}")
        self._save(cid, tools=dataclasses.asdict(opts))
        return opts

    def allow(self, cid: int, tool: str) -> None:
        """"Always allow this tool in this conversation"."""
        opts = self.options(cid)
        if tool not in opts.allowed:
            self.set_options(cid, allowed=opts.allowed + [tool])

    def json_schema(self, cid: int) -> str:
        value = self.store.get_conversation(cid).options.get("json_schema")
        return value if isinstance(value, str) else ""

    def set_json_schema(self, cid: int, text: str) -> str:
        """Replies of this conversation must be JSON matching `text` (a JSON schema; "" for
        none). ValueError says what is wrong with it; nothing is saved then."""
        text = (text or "").strip()
        if text:
            guided = GuidedDecoding.json_schema(text)
            schema = json.loads(guided.value)
            if isinstance(schema, dict):
                _check_schema(schema)
        self._save(cid, json_schema=text)
        return text

    def _save(self, cid: int, **options: Any) -> None:
        conv = self.store.get_conversation(cid)
        self.store.update_conversation(cid, options={**conv.options, **options})

    # ---- a turn -------------------------------------------------------------------------------
    def plan(self, cid: int) -> ToolPlan | None:
        """What the conversation's next turn does with tools; None when it uses none and has no
        schema. A server that does not answer is a ChatError naming it (nothing sent)."""
        opts, schema = self.options(cid), self.json_schema(cid)
        if not opts.servers and not schema:
            return None
        specs, owners = [], {}
        for server in (s for s in self.servers() if s.id in opts.servers):
            try:
                listed = self.tools(server.id)
            except ToolError as exc:
                raise ChatError(f"tool server {server.name} does not answer: {exc}") from None
            for tool in listed:
                if tool.name in owners:
                    log.warning("tool %s of %s hidden by %s's", tool.name, server.name,
                                owners[tool.name].name)
                    continue
                try:
                    specs.append(ToolSpec(tool.name, tool.description, tool.input_schema
                                          or {"type": "object", "properties": {}}))
                except ValueError as exc:
                    log.warning("tool %s of %s left out: %s", tool.name, server.name, exc)
                    continue
                owners[tool.name] = server
        guided = GuidedDecoding.json_schema(schema) if schema else None
        return ToolPlan(specs, owners, set(opts.allowed), opts.max_steps, opts.first, guided,
                        self.client, allow=lambda name: self.allow(cid, name))

    def decide(self, cid: int, choice: str) -> bool:
        """The user's answer to the call waiting in conversation cid: "approve", "deny" or
        "always"; False when nothing waits."""
        turn = self.turns.turn(cid)
        decide = getattr(turn, "decide", None)
        return bool(decide and decide(choice))


def _check_schema(schema: dict) -> None:
    """A schema that is JSON but not a JSON schema is refused with the validator's words."""
    try:
        from jsonschema import SchemaError, validators
    except ImportError:            # the engine's compile still refuses a bad one
        return
    try:
        validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        raise ValueError(f"the JSON schema is not valid: {exc.message}") from None
