"""What a conversation with tools sends to `tokenizer.apply_chat_template`.

`prompt_messages(messages, tools, fmt)` takes OpenAI-shaped messages (assistant messages with
`tool_calls` whose `function.arguments` is JSON text; `role: "tool"` results with
`tool_call_id`) and returns (messages, template_kwargs):
- for a template that knows tools (hermes, llama3, mistral, mistral_v11), the template's own `tools=`
  argument and the messages in the shape Hugging Face templates read: arguments as a dict
  (Qwen2.5 and Llama 3.1 write `arguments | tojson`), every content a string, and for Mistral
  call ids of exactly 9 letters and digits (its templates refuse others; a result keeps
  pointing at its call because both ids map the same way);
- for a "generic" template, a system message that describes the tools and the `<tool_call>`
  syntax, assistant calls written into the assistant's text in that syntax, and tool results as
  a user turn of `<tool_response>` blocks (one turn for consecutive results, so user and
  assistant turns still alternate).
`tools` None or empty (tool_choice "none") offers no tools; past calls and results are still
rendered.
"""

from __future__ import annotations

import hashlib
import json
import string

from localpaged.chat.tools.formats import ToolFormat
from localpaged.chat.tools.spec import ToolSpec

_ALNUM = set(string.ascii_letters + string.digits)

GENERIC_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


def prompt_messages(messages: list[dict], tools: list[ToolSpec] | None,
                    fmt: ToolFormat) -> tuple[list[dict], dict]:
    tools = list(tools or [])
    if fmt.template_has_tools:
        out = [_for_template(m, i, fmt) for i, m in enumerate(messages)]
        return out, ({"tools": [t.openai() for t in tools]} if tools else {})
    return _generic(messages, tools), {}


def _for_template(m: dict, i: int, fmt: ToolFormat) -> dict:
    out = dict(m)
    out["content"] = _text(m.get("content"))
    ids = _mistral_id if fmt.family.startswith("mistral") else (lambda x: x)
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": ids(c.get("id") or f"call{i}_{j}"), "type": "function",
                              "function": {"name": c["function"]["name"],
                                           "arguments": _arguments(c, i, j)}}
                             for j, c in enumerate(m["tool_calls"])]
    elif "tool_calls" in out:
        del out["tool_calls"]           # templates test `message.tool_calls` or `in message`
    if m.get("role") == "tool" and m.get("tool_call_id") is not None:
        out["tool_call_id"] = ids(m["tool_call_id"])
    return out


def _generic(messages: list[dict], tools: list[ToolSpec]) -> list[dict]:
    out: list[dict] = []
    for i, m in enumerate(messages):
        role, content = m.get("role"), _text(m.get("content"))
        if role == "assistant" and m.get("tool_calls"):
            calls = [json.dumps({"name": c["function"]["name"],
                                 "arguments": _arguments(c, i, j)}, ensure_ascii=False)
                     for j, c in enumerate(m["tool_calls"])]
            blocks = "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls)
            out.append({"role": "assistant",
                        "content": f"{content}\n{blocks}" if content else blocks})
        elif role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append({"role": role, "content": content,
                        **({"name": m["name"]} if m.get("name") else {})})
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        described = GENERIC_SYSTEM.format(tools="\n".join(
            json.dumps(t.openai(), ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{described}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def _arguments(call: dict, i: int, j: int) -> dict:
    """A call's arguments as a dict (they travel as JSON text)."""
    args = call.get("function", {}).get("arguments")
    if isinstance(args, dict):
        return args
    try:
        value = json.loads(args) if isinstance(args, str) and args.strip() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"messages[{i}].tool_calls[{j}].function.arguments is not JSON: "
                         f"{e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"messages[{i}].tool_calls[{j}].function.arguments must be a JSON "
                         "object")
    return value


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _mistral_id(call_id: str) -> str:
    """9 letters and digits, the same for the same id."""
    kept = "".join(ch for ch in call_id if ch in _ALNUM)
    if len(kept) >= 9:
        return kept[-9:]
    digest = hashlib.sha256(call_id.encode()).hexdigest()
    return (kept + digest)[:9]
