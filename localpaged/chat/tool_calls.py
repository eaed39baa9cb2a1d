"""Tool calls: the one place that knows how models write them and how they go back into a
prompt, used by the OpenAI API, the Anthropic endpoint and the chat UI.

    fmt = tool_format(tokenizer.chat_template)         # "hermes" | "llama3" | "mistral" | "generic"
    tools = [ToolSpec.from_openai(t) for t in body_tools]
    messages, kwargs = prompt_messages(messages, tools, fmt)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    params = SamplingParams(..., guided=fmt.guided(tools, "auto", parallel_tool_calls=True))
    reply = fmt.parse(text)                           # ParsedReply(content, tool_calls)
    parser = fmt.stream_parser(); parser.feed(delta) -> [TextDelta | CallStart | ArgsDelta]

The implementation lives in localpaged/chat/tools/ (one module per concern); this module is
its public face.
"""

from localpaged.chat.tools.formats import FAMILIES, ToolFormat, tool_format
from localpaged.chat.tools.parsing import ArgsDelta, CallStart, Delta, StreamParser, TextDelta
from localpaged.chat.tools.prompt import prompt_messages
from localpaged.chat.tools.spec import (
    Choice,
    ParsedReply,
    ToolCall,
    ToolSpec,
    normalize_choice,
)

__all__ = ["FAMILIES", "ArgsDelta", "CallStart", "Choice", "Delta", "ParsedReply",
           "StreamParser", "TextDelta", "ToolCall", "ToolFormat", "ToolSpec", "normalize_choice",
           "prompt_messages", "tool_format"]
