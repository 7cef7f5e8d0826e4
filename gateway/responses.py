"""OpenAI's response bodies and stream events for one generation (chat or text completion) of n choices."""

import json
import time

from client.messages import GenerateResult, TokenLogprob
from gateway.tools import read_call


class Shaper:
    """Bodies of one request: `chat` (chat.completion) or not (text_completion), with its id, model and time, and
    whether it asked for log probabilities."""

    def __init__(
        self,
        chat: bool,
        request_id: str,
        model: str,
        logprobs: bool = False,
        tools: list | None = None,
        forced_call: bool = False,
    ):
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.model = model
        self.created = int(time.time())
        self.logprobs = logprobs
        self.text_offsets: dict[int, int] = {}  # per choice of a streamed text completion: its text so far
        self.tools = tools  # the functions a chat answer may call (gateway.tools), or None
        self.forced_call = forced_call  # the answer is constrained to a call (tool_choice "required" or a named one)

    def _answer(self, result: GenerateResult) -> tuple[dict, str]:
        """A chat choice's message and finish reason: a function call when tools are on and the text is one."""
        calls = read_call(result.text, self.tools) if self.tools else None
        if calls is None:
            return {"role": "assistant", "content": result.text}, result.finish_reason
        return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"

    def _logprobs(self, entries: tuple[TokenLogprob, ...], index: int) -> dict | None:
        """A choice's `logprobs` for these tokens in OpenAI's shape (chat's `content` list, or the legacy
        completions' parallel lists); None when the request asked for none."""
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": [chat_logprob(entry) for entry in entries]}
        offset, offsets = self.text_offsets.get(index, 0), []
        for entry in entries:
            offsets.append(offset)
            offset += len(entry.token)
        self.text_offsets[index] = offset
        return {
            "tokens": [entry.token for entry in entries],
            "token_logprobs": [entry.logprob for entry in entries],
            "top_logprobs": [{top.token: top.logprob for top in entry.top} for entry in entries],
            "text_offset": offsets,
        }

    def _envelope(self, obj: str, choices: list, usage: dict | None = None) -> dict:
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body

    def complete(self, results: list[GenerateResult]) -> dict:
        """The whole answer (no streaming): choice i is results[i]."""
        choices = []
        for index, result in enumerate(results):
            choice = {
                "index": index,
                "finish_reason": result.finish_reason,
                "logprobs": self._logprobs(result.logprobs, index),
            }
            if self.chat:
                choice["message"], choice["finish_reason"] = self._answer(result)
            else:
                choice["text"] = result.text
            choices.append(choice)
        return self._envelope("chat.completion" if self.chat else "text_completion", choices, usage(results))

    def opening(self, index: int = 0) -> str | None:
        """The first event of a chat stream's choice (the assistant's role); None for text completions."""
        return self._event(index, {"role": "assistant", "content": ""}) if self.chat else None

    def piece(self, text: str, index: int = 0, logprobs: tuple[TokenLogprob, ...] = ()) -> str:
        return self._event(index, {"content": text} if self.chat else text, logprobs=self._logprobs(logprobs, index))

    def finish(self, result: GenerateResult, index: int = 0, finish_reason: str | None = None) -> str:
        return self._event(index, {} if self.chat else "", finish_reason=finish_reason or result.finish_reason)

    def call_piece(self, delta: dict, index: int, logprobs: tuple[TokenLogprob, ...]) -> str:
        """One delta of a forced call's stream (gateway.tools.CallPieces), with the log probabilities since the last."""
        return self._event(index, {"tool_calls": [delta]}, logprobs=self._logprobs(logprobs, index))

    def whole_answer(self, result: GenerateResult, index: int = 0) -> list[str]:
        """A chat choice with tools, streamed once it ended (whether it is a call is known only then): its content or
        its call as one delta, then its finish."""
        message, finish_reason = self._answer(result)
        if message["content"] is not None:
            delta = {"content": message["content"]}
        else:
            delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]}
        return [
            self._event(index, delta, logprobs=self._logprobs(result.logprobs, index)),
            self._event(index, {}, finish_reason=finish_reason),
        ]

    def usage_event(self, results: list[GenerateResult]) -> str:
        """The last event when the client asked for stream_options.include_usage: no choices, the usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return sse(self._envelope(obj, [], usage(results)))

    def _event(self, index: int, content, finish_reason: str | None = None, logprobs: dict | None = None) -> str:
        choice = {"index": index, "finish_reason": finish_reason, "logprobs": logprobs}
        choice.update({"delta": content} if self.chat else {"text": content})
        return sse(self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice]))


def chat_logprob(entry: TokenLogprob) -> dict:
    return {
        "token": entry.token,
        "logprob": entry.logprob,
        "bytes": list(entry.token.encode()),
        "top_logprobs": [
            {"token": top.token, "logprob": top.logprob, "bytes": list(top.token.encode())} for top in entry.top
        ],
    }


def usage(results: list[GenerateResult]) -> dict:
    """The prompt counts once (its choices share it, as OpenAI counts them), with the cached tokens of the first
    choice (what memd held before this request; the other choices find the first's prompt there); completion tokens
    are every choice's."""
    prompt = results[0].prompt_tokens
    completion = sum(result.completion_tokens for result in results)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": results[0].cached_tokens},
    }


def sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
