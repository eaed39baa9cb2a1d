"""Tools in the chat, without a browser: a backend that replies from a script (parsing calls
with the real hermes parser), a fake MCP client (or a real stdio server written here), and a
ChatController on a fresh store. Covers the tool loop's steps in the tree, approval, the step
limit, hanging and dying servers, a megabyte result, untrusted results, the JSON schema setting,
attachments, export/import and the store's migration of older files."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from localpaged.chat.tool_calls import tool_format
from localpaged.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from localpaged.ui import render
from localpaged.ui.controller import ChatController
from localpaged.ui.store import Store
from localpaged.ui.tools.mcp_client import McpClient, McpTool, ToolError, ToolResult
from localpaged.ui.tools.messages import read_attachment

HERMES = tool_format("{% for t in tools %}{% endfor %}<tool_call>")


def call_text(name: str, args: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


class ScriptBackend:
    """Replies from `script` in order; keeps what each request sent (messages, tools, choice)."""
    model_name = "scripted"
    supports_kv_stats = False

    def __init__(self, script: list[str]) -> None:
        self.script, self.sent = list(script), []

    def chat(self, messages, params, request_id=None, tools=None, tool_choice=None):
        self.sent.append({"messages": [dict(m) for m in messages], "tools": tools,
                          "choice": tool_choice, "params": params})
        text = self.script.pop(0) if self.script else "done."
        metrics = RequestMetrics(time.time(), time.time(), time.time(), 0, 3)
        yield RequestOutput(request_id, None, [1, 2, 3], [CompletionOutput(
            0, text, [7, 8, 9], "stop", finish_detail="eos")], True, metrics)

    def parse_reply(self, text):
        return HERMES.parse(text)

    def abort(self, request_id):
        pass

    def stats(self):
        return None


class FakeClient(McpClient):
    """Tools `echo` and `big`; `calls` records what ran; `hang` makes a call time out."""

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.error = [], None

    def list_tools(self, server, timeout=20):
        return [McpTool("echo", "Echo the text.", {"type": "object", "properties": {
            "text": {"type": "string"}}}), McpTool("big", "A huge result.", {})]

    def call_tool(self, server, name, arguments, timeout=60, max_chars=16_000):
        self.calls.append((name, arguments))
        if self.error:
            raise ToolError(self.error)
        if name == "big":
            text = "x" * 3_000_000
            return ToolResult(text[:max_chars], len(text))
        return ToolResult(f"echo: {arguments.get('text')}", len(arguments.get("text", "")) + 6)


def make(tmp_path, script, client=None):
    backend = ScriptBackend(script)
    store = Store(tmp_path / "c.db")
    ctl = ChatController(store, lambda: backend, {"temperature": 0.0, "max_tokens": 16},
                         tmp_path / "tabs.json", tool_client=client or FakeClient())
    cid = ctl.new_conversation().id
    return ctl, backend, cid


def with_tools(ctl, cid, **options):
    server = ctl.store.add_tool_server("fake", "stdio", ["fake-server"])
    ctl.tools.set_options(cid, servers=[server.id], **options)
    return server


def wait_pending(turn, timeout=10):
    deadline = time.monotonic() + timeout
    while turn.pending is None:
        assert time.monotonic() < deadline, "no call waited for approval"
        time.sleep(0.01)
    return turn.pending


def test_a_call_is_approved_run_and_answered_in_one_turn(tmp_path):
    ctl, backend, cid = make(tmp_path, [call_text("echo", {"text": "hi"}), "It said hi."])
    with_tools(ctl, cid)
    turn = ctl.send(cid, "use echo")
    pending = wait_pending(turn)
    assert pending["name"] == "echo" and json.loads(pending["arguments"]) == {"text": "hi"}
    assert ctl.tools.decide(cid, "approve")
    assert turn.wait(10) and turn.error is None
    path = ctl.store.active_path(cid)
    assert [m.role for m in path] == ["user", "assistant", "tool", "assistant"]
    call, tool, answer = path[1], path[2], path[3]
    assert call.extra["tool_calls"][0]["name"] == "echo" and "<tool_call>" not in call.content
    assert tool.content == "echo: hi" and tool.extra["state"] == "done"
    assert tool.extra["tool_call_id"] == call.extra["tool_calls"][0]["id"]
    assert tool.extra["duration_s"] >= 0 and answer.content == "It said hi."
    # the second step's prompt is the first's plus the call and its result
    first, second = backend.sent[0]["messages"], backend.sent[1]["messages"]
    assert second[:len(first)] == first
    assert second[len(first)]["tool_calls"][0]["function"]["name"] == "echo"
    assert second[-1] == {"role": "tool", "content": "echo: hi",
                          "tool_call_id": tool.extra["tool_call_id"], "name": "echo"}
    assert [s["choice"] for s in backend.sent] == ["auto", "auto"]
    assert [t.name for t in backend.sent[0]["tools"]] == ["echo", "big"]
    # the card shows on the page as rendered from the store (a restart reads the same)
    html = "".join(m["content"] for m in render.chat_messages(ctl.view(cid)))
    assert "lp-tool" in html and "echo: hi" in html and "echo" in html


def test_deny_and_always_allow(tmp_path):
    client = FakeClient()
    ctl, backend, cid = make(tmp_path, [call_text("echo", {"text": "a"}), "ok",
                                        call_text("echo", {"text": "b"}), "ok again",
                                        call_text("echo", {"text": "c"}), "fine"], client)
    with_tools(ctl, cid)
    turn = ctl.send(cid, "one")
    wait_pending(turn)
    ctl.tools.decide(cid, "deny")
    assert turn.wait(10)
    tool = ctl.store.active_path(cid)[2]
    assert tool.extra["state"] == "denied" and client.calls == []
    turn = ctl.send(cid, "two")
    wait_pending(turn)
    ctl.tools.decide(cid, "always")
    assert turn.wait(10) and client.calls == [("echo", {"text": "b"})]
    assert ctl.tools.options(cid).allowed == ["echo"]
    turn = ctl.send(cid, "three")                     # runs without asking now
    assert turn.wait(10) and turn.pending is None and len(client.calls) == 2


def test_the_step_limit_ends_the_turn_with_an_answer(tmp_path):
    loop = [call_text("echo", {"text": str(i)}) for i in range(5)]
    ctl, backend, cid = make(tmp_path, loop)
    with_tools(ctl, cid, max_steps=2, allowed=["echo"])
    turn = ctl.send(cid, "loop forever")
    assert turn.wait(10) and turn.error is None
    roles = [m.role for m in ctl.store.active_path(cid)]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [s["choice"] for s in backend.sent] == ["auto", "auto", "none"]
    last = ctl.store.active_path(cid)[-1]
    assert "tool_calls" not in last.extra        # the step after the limit is not parsed


def test_required_first_step(tmp_path):
    ctl, backend, cid = make(tmp_path, [call_text("echo", {"text": "x"}), "ok"])
    with_tools(ctl, cid, first="required", allowed=["echo"])
    assert ctl.send(cid, "go").wait(10)
    assert [s["choice"] for s in backend.sent] == ["required", "auto"]


def test_a_result_with_call_markup_is_only_text(tmp_path):
    client = FakeClient()
    ctl, backend, cid = make(tmp_path, [call_text("echo", {"text": call_text("big", {})}),
                                        "plain answer"], client)
    with_tools(ctl, cid, allowed=["echo"])
    assert ctl.send(cid, "go").wait(10)
    assert [c[0] for c in client.calls] == ["echo"]      # big never ran
    tool = ctl.store.active_path(cid)[2]
    assert "<tool_call>" in tool.content
    html = "".join(m["content"] for m in render.chat_messages(ctl.view(cid)))
    assert "<tool_call>" not in html and "&lt;tool_call&gt;" in html


def test_a_megabyte_result_is_cut_and_says_so(tmp_path):
    ctl, backend, cid = make(tmp_path, [call_text("big", {}), "ok"])
    with_tools(ctl, cid, allowed=["big"])
    start = time.monotonic()
    assert ctl.send(cid, "go").wait(10)
    tool = ctl.store.active_path(cid)[2]
    assert len(tool.content) == 16_000 and tool.extra["total_chars"] == 3_000_000
    assert len(backend.sent[1]["messages"][-1]["content"]) == 16_000
    html = "".join(m["content"] for m in render.chat_messages(ctl.view(cid)))
    assert "cut: 16,000 of 3,000,000 characters" in html
    assert time.monotonic() - start < 10


def test_a_server_error_shows_in_the_card_and_the_chat_goes_on(tmp_path):
    client = FakeClient()
    client.error = "echo on fake: no answer within 1 s (the server hangs?)"
    ctl, backend, cid = make(tmp_path, [call_text("echo", {"text": "x"}), "sorry", "hello"],
                             client)
    with_tools(ctl, cid, allowed=["echo"])
    turn = ctl.send(cid, "go")
    assert turn.wait(10) and turn.error is None
    tool = ctl.store.active_path(cid)[2]
    assert tool.extra["state"] == "error" and "the server hangs" in tool.content
    assert ctl.send(cid, "still there?").wait(10)                 # usable afterwards
    assert ctl.store.active_path(cid)[-1].content == "hello"


def test_stop_while_waiting_for_approval(tmp_path):
    ctl, backend, cid = make(tmp_path, [call_text("echo", {"text": "x"})])
    with_tools(ctl, cid)
    turn = ctl.send(cid, "go")
    wait_pending(turn)
    ctl.stop(cid)
    assert turn.wait(10) and not ctl.busy(cid)
    assert ctl.store.active_path(cid)[-1].extra["state"] == "stopped"


def test_regenerate_branches_from_a_step(tmp_path):
    ctl, backend, cid = make(tmp_path, [call_text("echo", {"text": "x"}), "first answer",
                                        "second answer"])
    with_tools(ctl, cid, allowed=["echo"])
    assert ctl.send(cid, "go").wait(10)
    answer = ctl.store.active_path(cid)[-1]
    assert ctl.regenerate(answer.id).wait(10)
    path = ctl.store.active_path(cid)
    assert [m.role for m in path] == ["user", "assistant", "tool", "assistant"]
    assert path[-1].content == "second answer" and len(ctl.store.siblings(path[-1].id)[0]) == 2
    assert backend.sent[-1]["messages"][-1]["role"] == "tool"


def test_export_import_and_search_keep_the_steps(tmp_path):
    ctl, backend, cid = make(tmp_path, [call_text("echo", {"text": "zebra"}), "done"])
    with_tools(ctl, cid, allowed=["echo"])
    assert ctl.send(cid, "go").wait(10)
    copy = ctl.store.import_json(json.loads(ctl.export(cid, "json")))
    a = [(m.role, m.content, m.extra) for m in ctl.store.active_path(cid)]
    b = [(m.role, m.content, m.extra) for m in ctl.store.active_path(copy.id)]
    assert a == b
    assert {c.id for c in ctl.search("zebra")} == {cid, copy.id}
    assert "Tool result: echo" in ctl.export(cid)


def test_json_schema_setting(tmp_path):
    ctl, backend, cid = make(tmp_path, ['{"a": 1}'])
    with pytest.raises(ValueError, match="not valid JSON"):
        ctl.tools.set_json_schema(cid, "{nope")
    with pytest.raises(ValueError, match="JSON schema is not valid"):
        ctl.tools.set_json_schema(cid, '{"type": 12}')
    assert ctl.tools.json_schema(cid) == ""
    ctl.tools.set_json_schema(cid, '{"type": "object"}')
    assert ctl.send(cid, "json please").wait(10)
    guided = backend.sent[0]["params"][0].guided
    assert guided.kind == "json_schema" and json.loads(guided.value) == {"type": "object"}
    assert backend.sent[0]["tools"] is None


def test_attachments_go_into_the_prompt_and_the_store(tmp_path):
    ctl, backend, cid = make(tmp_path, ["read it"])
    src = tmp_path / "notes.py"
    src.write_text("def secret():\n    return 42\n")
    att = read_attachment(src)
    assert ctl.send(cid, "what does it return?", attachments=[att]).wait(10)
    user = ctl.store.active_path(cid)[0]
    assert user.content == "what does it return?"
    assert user.extra["attachments"][0]["name"] == "notes.py"
    sent = backend.sent[0]["messages"][-1]["content"]
    assert "what does it return?" in sent and "return 42" in sent and "notes.py" in sent
    ctl.send(cid, "and again?").wait(10)                   # the same text on the next turn
    assert backend.sent[1]["messages"][0]["content"] == sent
    (tmp_path / "bin.dat").write_bytes(b"\x00\x01binary")
    with pytest.raises(ValueError, match="bin.dat is not a text file"):
        read_attachment(tmp_path / "bin.dat")


def test_the_send_handler_reads_attached_files_and_shows_them(tmp_path):
    """ChatEvents.send(files=): the files' text goes with the message (a file holding a code
    fence cannot close its own), the sent message's footer names them, the list empties; an
    unreadable file is refused and nothing is sent."""
    from localpaged.ui.chat.events import ChatEvents
    from localpaged.ui.settings.logic import SAMPLING_KEYS
    from localpaged.ui.tabs.events import TabSet
    ctl, backend, cid = make(tmp_path, ["seen"])
    ev = ChatEvents(ctl, TabSet(ctl))
    fields = [{"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
               "max_tokens": 8}[k] for k in SAMPLING_KEYS]
    doc = tmp_path / "readme.md"
    doc.write_text("Run:\n```sh\nmake\n```\n")
    steps = list(ev.send([cid, None, None, None], 0, "summarise", "", *fields, files=[str(doc)]))
    assert steps[0].msg == "" and steps[0].attach.visible is False
    user = ctl.store.active_path(cid)[0]
    assert [a["name"] for a in user.extra["attachments"]] == ["readme.md"]
    sent = backend.sent[0]["messages"][-1]["content"]
    assert sent.startswith("summarise\n\nAttached file readme.md:\n````\nRun:\n```sh")
    assert sent.endswith("```\n\n````")
    assert "📎 readme.md (20 characters)" in render.footer(user, (1, 1))
    (tmp_path / "bin.dat").write_bytes(b"\x00\x01binary")
    before = ctl.store.messages(cid)
    with pytest.warns(UserWarning, match="bin.dat is not a text file"):
        list(ev.send([cid, None, None, None], 0, "and this?", "", *fields,
                     files=[str(tmp_path / "bin.dat")]))
    assert ctl.store.messages(cid) == before and len(backend.sent) == 1


def test_pdf_attachment(tmp_path):
    pypdf = pytest.importorskip("pypdf")
    writer = pypdf.PdfWriter()
    writer.add_blank_page(72, 72)
    (tmp_path / "blank.pdf").write_bytes(b"")
    with open(tmp_path / "blank.pdf", "wb") as f:
        writer.write(f)
    with pytest.raises(ValueError, match="no text to extract"):
        read_attachment(tmp_path / "blank.pdf")


def test_store_migration_from_version_5_keeps_rows(tmp_path):
    from helpers.store_versions import old_store
    path = tmp_path / "v5.db"
    conn = old_store(path, 5, rows=True)
    conn.commit()
    conn.close()
    with Store(path) as s:
        convs = s.list_conversations()
        path_msgs = s.active_path(convs[0].id)
        assert path_msgs and all(m.extra == {} for m in path_msgs)
        tool = s.add_message(convs[0].id, path_msgs[-1].id, "tool", "result",
                             extra={"name": "echo"})
        assert s.get_message(tool.id).role == "tool"
        assert s.db.execute("PRAGMA foreign_key_check").fetchall() == []
        assert s.get_conversation(convs[0].id).active_root_id == path_msgs[0].id


def test_real_stdio_server_hang_and_death(tmp_path):
    (tmp_path / "hang.py").write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "die.py").write_text("import sys\nsys.exit(3)\n")
    threads_before = threading.active_count()
    client = McpClient()
    from localpaged.ui.store import ToolServer
    start = time.monotonic()
    with pytest.raises(ToolError, match="no answer within 1 s"):
        client.list_tools(ToolServer(1, "hang", "stdio", (sys.executable, str(tmp_path / "hang.py"))),
                          timeout=1)
    with pytest.raises(ToolError, match="exited or closed"):
        client.list_tools(ToolServer(2, "die", "stdio", (sys.executable, str(tmp_path / "die.py"))))
    assert time.monotonic() - start < 30
    client.close()
    deadline = time.monotonic() + 10      # nothing of the hung or dead server stays behind
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert threading.active_count() <= threads_before
