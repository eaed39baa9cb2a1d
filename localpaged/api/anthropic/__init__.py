"""The Anthropic Messages API (`/v1/messages`) over the same engine path as the OpenAI routes.

- protocol.py: the request bodies (content blocks, tools, tool_choice), strictly typed.
- convert.py: a request as OpenAI-shaped chat messages, tools, tool_choice and SamplingParams.
- events.py: the engine's outputs as content blocks and streaming events (`Reply`).
- errors.py: errors in Anthropic's shape; the API key as `x-api-key` or Bearer.
- routes.py: `create_messages_api(served, api_key, recorder, images)`, the APIRouter.
"""

from localpaged.api.anthropic.routes import create_messages_api

__all__ = ["create_messages_api"]
