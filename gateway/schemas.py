"""The OpenAI request bodies the gateway accepts, and the modeld Generate arguments they become.

Fields OpenAI defines that the gateway does not serve are refused (400) rather than ignored when ignoring them
would change the answer (echo, best_of); other unknown fields are ignored, as OpenAI-compatible servers do."""

import json
import struct
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from client.choices import MAX_CHOICES, SEED_RANGE
from gateway.errors import ApiError
from gateway.tools import Tool, ToolChoice, constraint_for

MAX_TOP_LOGPROBS = 20  # chat's top_logprobs
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions' logprobs


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    name: str = "response"
    schema_: dict = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: free text, any JSON object, or JSON a schema accepts; and, as vLLM and SGLang
    take it, a regex."""

    type: Literal["text", "json_object", "json_schema", "regex"]
    json_schema: JsonSchemaFormat | None = None
    regex: str | None = None

    def constraint(self) -> dict:
        """The client library's constraint argument for it (none for text)."""
        if self.type == "json_object":
            return {"json_object": True}
        if self.type == "json_schema":
            if self.json_schema is None:
                raise ApiError(400, "response_format json_schema needs its json_schema", param="response_format")
            return {"json_schema": self.json_schema.schema_}
        if self.type == "regex":
            if not self.regex:
                raise ApiError(400, "response_format regex needs its regex", param="response_format")
            return {"regex": self.regex}
        return {}


class SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=SEED_RANGE)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None

    @field_validator("top_p")
    @classmethod
    def top_p_survives_float32(cls, value: float | None) -> float | None:
        """modeld's top_p is a float32: a positive value that rounds to 0 there would be refused as 0.0."""
        if value is not None and struct.unpack("f", struct.pack("f", value))[0] == 0.0:
            raise ValueError(f"top_p {value!r} is 0 as a float32 (modeld's precision): at least 1.4e-45")
        return value

    def check_supported(self) -> None:
        """Refusals that need no modeld (before one is picked)."""
        if self.response_format is not None:
            self.response_format.constraint()
        self.top_logprobs_asked()

    def top_logprobs_asked(self) -> int | None:
        """None: no log probabilities; else how many alternatives each position lists."""
        return None

    def sampling(self, max_tokens: int | None, choice: int) -> dict:
        """The client library's Generate arguments for these fields (unset ones take modeld's defaults). Choice i of
        n samples with seed + i, so each has its own stream and a request with a seed is reproducible."""
        values = dict(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=None if self.seed is None else (self.seed + choice) % SEED_RANGE,
            stop=self.stop or None,
        )
        top = self.top_logprobs_asked()
        if top is not None:
            values.update(logprobs=True, top_logprobs=top)
        if self.response_format is not None:
            values.update(self.response_format.constraint())
        return {key: value for key, value in values.items() if value is not None}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # None: an assistant's message that only calls functions
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None

    def turn(self) -> dict[str, str]:
        """The message as modeld renders it (developer is OpenAI's newer name of system)."""
        content = self.content or ""
        text = content if isinstance(content, str) else "".join(part.text for part in content)
        turn = {"role": "system" if self.role == "developer" else self.role, "content": text}
        if self.tool_calls:
            turn["tool_calls"] = json.dumps(self.tool_calls)
        if self.tool_call_id:
            turn["tool_call_id"] = self.tool_call_id
        return turn


class ChatRequest(SamplingRequest):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def top_logprobs_asked(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def calls_tools(self) -> bool:
        """The answer may be a function call (tools given, tool_choice not "none")."""
        return bool(self.tools) and self.tool_choice != "none"

    def check_supported(self) -> None:
        super().check_supported()
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        if self.calls_tools and self.response_format is not None and self.response_format.type != "text":
            raise ApiError(400, "give tools or a response_format, not both", param="response_format")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ApiError(400, "give max_tokens or max_completion_tokens, not both", param="max_tokens")

    def generate_arguments(self, choice: int = 0) -> dict:
        turns = [m.turn() for m in self.messages]
        arguments = dict(messages=turns, **self.sampling(self.max_completion_tokens or self.max_tokens, choice))
        if self.calls_tools:
            arguments["tools"] = [tool.model_dump() for tool in self.tools]
            arguments.update(constraint_for(self.tools, self.tool_choice or "auto"))
        return arguments

    def affinity_key(self) -> str:
        """The conversation as text, for prefix affinity: a conversation that goes on shares its prefix."""
        return "".join(f"<{m['role']}>{m['content']}" for m in (message.turn() for message in self.messages))


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int]
    echo: bool = False
    best_of: int | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)  # the alternatives listed at each position

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs

    def check_supported(self) -> None:
        super().check_supported()
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            raise ApiError(400, "give one prompt per request", param="prompt")
        if self.echo:
            raise ApiError(400, "echo is not supported", param="echo")
        if self.best_of not in (None, 1):
            raise ApiError(400, "best_of is not supported", param="best_of")

    def single_prompt(self) -> str | list[int]:
        """The prompt: a text, or token ids (a list of one text is that text)."""
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            return self.prompt[0]
        return self.prompt

    def generate_arguments(self, choice: int = 0) -> dict:
        prompt = self.single_prompt()
        source = dict(input_ids=prompt) if isinstance(prompt, list) else dict(prompt=prompt)
        return dict(**source, **self.sampling(self.max_tokens, choice))

    def affinity_key(self) -> str:
        prompt = self.single_prompt()
        return prompt if isinstance(prompt, str) else ",".join(map(str, prompt))
