"""OpenAI's response bodies and stream events for one generation (chat or text completion)."""

import json
import time

from client.messages import GenerateResult


class Shaper:
    """Bodies of one request: `chat` (chat.completion) or not (text_completion), with its id, model and time."""

    def __init__(self, chat: bool, request_id: str, model: str):
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.model = model
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list, usage: dict | None = None) -> dict:
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body

    def complete(self, result: GenerateResult) -> dict:
        """The whole answer (no streaming)."""
        choice = {"index": 0, "finish_reason": result.finish_reason, "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice["text"] = result.text
        return self._envelope("chat.completion" if self.chat else "text_completion", [choice], usage(result))

    def opening(self) -> str | None:
        """The first event of a chat stream (the assistant's role); None for text completions."""
        return self._event({"role": "assistant", "content": ""}) if self.chat else None

    def piece(self, text: str) -> str:
        return self._event({"content": text} if self.chat else text)

    def finish(self, result: GenerateResult) -> str:
        return self._event({} if self.chat else "", finish_reason=result.finish_reason)

    def usage_event(self, result: GenerateResult) -> str:
        """The last event when the client asked for stream_options.include_usage: no choices, the usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return sse(self._envelope(obj, [], usage(result)))

    def _event(self, content, finish_reason: str | None = None) -> str:
        choice = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        choice.update({"delta": content} if self.chat else {"text": content})
        return sse(self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice]))


def usage(result: GenerateResult) -> dict:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }


def sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
