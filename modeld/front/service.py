"""modeld's gRPC servicer on grpc.aio: Generate (server streaming), Abort, GetInfo, Capacity.

Every handler runs on the front's one asyncio loop, no thread per stream; the engine runs in its own process
(modeld.front.engine_client). A request's checks, chat template and tokenizing run on one worker thread beside the loop
(bounded first: modeld.front.limits), so a large prompt never holds up health checks or the other streams. What the
engine sends for a request goes into its queue and wakes its stream, which takes what is queued, makes its text
and sends it as one message."""

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc

from modeld.detokenize import TextStream
from modeld.engine.output import take_events
from modeld.front.engine_client import ENGINE_GONE, EngineClient
from modeld.front.limits import (
    chat_turn_tokens,
    check_message_count,
    check_request_id,
    check_stops,
    check_text_size,
    text_bytes_per_token,
)
from modeld.front.tool_turns import template_turns
from modeld.request import Request
from modeld.sampling_params import DEFAULT_MAX_NEW_TOKENS, Constraint, InvalidRequest, SamplingParams
from protos import memd_pb2, memd_pb2_grpc, modeld_pb2, modeld_pb2_grpc

CHAT_ROLES = ("system", "user", "assistant", "tool")
FINISH_REASONS = {"stop": modeld_pb2.STOP, "length": modeld_pb2.LENGTH, "abort": modeld_pb2.ABORT}


class ModeldService(modeld_pb2_grpc.ModeldServicer):
    def __init__(self, engine: EngineClient, memd: str, max_open_streams: int):
        """memd: its address (Capacity asks it, with a channel of this loop); max_open_streams: the Generate streams
        served at once (StreamLimit's bound), which GetInfo reports so that a gateway queues before it."""
        self.engine = engine
        self.max_open_streams = max_open_streams
        self.tokenizer = engine.tokenizer
        self.text_bytes_per_token = text_bytes_per_token(self.tokenizer) if self.tokenizer is not None else 0
        self.turn_tokens = chat_turn_tokens(self.tokenizer) if self.tokenizer is not None else 1
        template = getattr(self.tokenizer, "chat_template", None) or ""
        self.template_takes_tools = "tools" in template
        # One thread: a fast tokenizer is not safe to encode with from several threads at once, and the bounds keep
        # each request's share of it short.
        self.prepare = ThreadPoolExecutor(1, thread_name_prefix="modeld-prepare")
        self.vocab_size = engine.vocab_size
        self.memd = memd_pb2_grpc.MemdStub(grpc.aio.insecure_channel(memd))

    async def Generate(self, request, context):
        try:
            req = await self.prepared(request)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        await self._check_serving(context)
        req.wakeup = asyncio.Event()
        if not self.engine.submit(req):
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"request id {req.rid!r} is already running")
        try:
            async for response in self._responses(req, context):
                yield response
        finally:
            if req.finish is None:  # the client went away (cancel, deadline, crash): the abort frees its slots
                self.engine.abort(req.rid)

    async def _responses(self, req: Request, context):
        # The text of a request without stop strings is made here, in the front, off the engine's process; that of
        # one with stop strings comes from the engine (its text decides when it stops).
        own_text = None if req.params.stop else TextStream(self.tokenizer, [])
        engine_text = ""
        while True:
            await req.wakeup.wait()
            req.wakeup.clear()
            chunk, complete = take_events(req.events)
            if chunk is not None:
                ids, text, finished, logprobs = chunk
                if own_text is not None:
                    text = own_text.add(ids, finished)
                else:
                    engine_text += text
                yield modeld_pb2.GenerateResponse(
                    request_id=req.rid,
                    chunk=modeld_pb2.GenerateChunk(token_ids=ids, text=text, logprobs=self._logprobs(ids, logprobs)),
                )
            if not complete:
                continue
            finish = req.finish
            if finish.error_code:
                await context.abort(getattr(grpc.StatusCode, finish.error_code), finish.error)
            tail = own_text.take(finished=True)[0] if own_text is not None else ""
            if tail:  # a request that ended without a finishing chunk (an abort): its held-back text
                yield modeld_pb2.GenerateResponse(
                    request_id=req.rid, chunk=modeld_pb2.GenerateChunk(token_ids=[], text=tail)
                )
            text = own_text.sent if own_text is not None else engine_text
            yield modeld_pb2.GenerateResponse(request_id=req.rid, complete=self._complete(req, text))
            return

    async def _check_serving(self, context) -> None:
        if self.engine.gone:
            await context.abort(grpc.StatusCode.UNAVAILABLE, ENGINE_GONE)
        if self.engine.memd_lost:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "memd is unreachable")

    def _complete(self, req: Request, text: str) -> modeld_pb2.GenerateComplete:
        completion = len(req.output_ids)
        return modeld_pb2.GenerateComplete(
            output_ids=req.output_ids,
            text=text,
            finish_reason=FINISH_REASONS[req.finish.reason],
            matched_stop=req.finish.matched_stop,
            prompt_tokens=len(req.prompt_ids),
            completion_tokens=completion,
            cached_tokens=req.cached_tokens,
            spec_verify_ct=req.spec_verify_ct,
            spec_accept_length=req.accept_length(),
            logprobs=self._logprobs(req.output_ids, req.output_logprobs if req.params.logprobs else None),
        )

    def _logprobs(self, ids: list[int], logprobs) -> list[modeld_pb2.TokenLogprob]:
        """TokenLogprob messages for the ids, each token's text beside its id (none without logprobs asked)."""
        if logprobs is None:
            return []
        text = self._token_text
        return [
            modeld_pb2.TokenLogprob(
                token_id=token,
                logprob=entry.logprob,
                token=text(token),
                top_ids=[t for t, _ in entry.top],
                top_logprobs=[lp for _, lp in entry.top],
                top_tokens=[text(t) for t, _ in entry.top],
            )
            for token, entry in zip(ids, logprobs)
        ]

    def _token_text(self, token: int) -> str:
        return self.tokenizer.decode([token]) if self.tokenizer is not None else ""

    async def prepared(self, request: modeld_pb2.GenerateRequest) -> Request:
        """_build on the prepare thread, off the loop."""
        return await asyncio.get_running_loop().run_in_executor(self.prepare, self._build, request)

    def _build(self, request: modeld_pb2.GenerateRequest) -> Request:
        """Validates a GenerateRequest, the prompt last (so nothing is tokenized for a request refused anyway); raises
        InvalidRequest with what is wrong."""
        check_request_id(request.request_id)
        s = request.sampling
        check_stops(s.stop, s.stop_token_ids)
        if s.HasField("max_new_tokens") and s.HasField("max_tokens"):
            raise InvalidRequest("give max_new_tokens or its alias max_tokens, not both")
        max_new = (
            s.max_new_tokens
            if s.HasField("max_new_tokens")
            else s.max_tokens
            if s.HasField("max_tokens")
            else DEFAULT_MAX_NEW_TOKENS
        )
        params = SamplingParams(
            max_new_tokens=max_new,
            temperature=s.temperature if s.HasField("temperature") else 1.0,
            top_p=s.top_p if s.HasField("top_p") else 1.0,
            top_k=s.top_k if s.HasField("top_k") else 0,
            seed=s.seed if s.HasField("seed") else None,
            stop=tuple(s.stop),
            stop_token_ids=tuple(s.stop_token_ids),
            ignore_eos=s.ignore_eos,
            constraint=constraint_of(request),
            logprobs=s.logprobs,
            top_logprobs=s.top_logprobs,
        )
        self._check_vocabulary("stop_token_ids", params.stop_token_ids)
        context_len = self.engine.context_len  # memd's, again after a re-attach
        prompt = self._prompt_ids(request, context_len)
        if len(prompt) + params.max_new_tokens > context_len:
            raise InvalidRequest(
                f"prompt ({len(prompt)} tokens) plus max_new_tokens ({params.max_new_tokens}) exceeds the context of "
                f"{context_len}"
            )
        rid = request.request_id or uuid.uuid4().hex
        return Request(rid=rid, prompt_ids=prompt, params=params)  # the engine process makes its generator

    def _prompt_ids(self, request, context_len: int) -> list[int]:
        if request.HasField("input_ids"):
            count = len(request.input_ids.ids)
            if count > context_len:
                raise InvalidRequest(f"the prompt ({count} tokens) exceeds the context of {context_len}")
            ids = list(request.input_ids.ids)
            self._check_vocabulary("input_ids", ids)
        elif request.HasField("text"):
            if self.tokenizer is None:
                raise InvalidRequest("this model has no tokenizer: send input_ids")
            check_text_size(request.text, context_len, self.text_bytes_per_token)
            if request.apply_chat_template:
                ids = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": request.text}],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                )
            else:
                ids = self.tokenizer(request.text)["input_ids"]
        elif request.HasField("messages"):
            ids = self._chat_ids(request.messages.messages, request.messages.tools, context_len)
        else:
            raise InvalidRequest("give the prompt as text, input_ids or messages")
        if not ids:
            raise InvalidRequest("the prompt is empty")
        return list(ids)

    def _chat_ids(self, messages, tools: str, context_len: int) -> list[int]:
        """A conversation (with its functions, if any) through the chat template, the assistant's turn opened."""
        if self.tokenizer is None:
            raise InvalidRequest("this model has no tokenizer: send input_ids")
        if not messages:
            raise InvalidRequest("messages is empty")
        check_message_count(len(messages), context_len, self.turn_tokens)
        bad = next((m.role for m in messages if m.role not in CHAT_ROLES), None)
        if bad is not None:
            raise InvalidRequest(f"message role {bad!r}: one of {', '.join(CHAT_ROLES)}")
        text = "".join(m.content + m.tool_calls for m in messages) + tools
        check_text_size(text, context_len, self.text_bytes_per_token)
        turns, template_tools = template_turns(messages, tools, self.template_takes_tools)
        return self.tokenizer.apply_chat_template(
            turns, tools=template_tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )

    def _check_vocabulary(self, field: str, ids) -> None:
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequest(f"{field}: token id {bad} is outside the vocabulary [0, {self.vocab_size})")

    async def Abort(self, request, context):
        try:
            check_request_id(request.request_id)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return modeld_pb2.AbortResponse(found=self.engine.abort(request.request_id))

    async def GetInfo(self, request, context):
        running, waiting, spec = await self.engine.counts_and_spec()
        return modeld_pb2.GetInfoResponse(
            **self.engine.info,
            **spec,
            running_requests=running,
            waiting_requests=waiting,
            max_open_streams=self.max_open_streams,
        )

    async def Capacity(self, request, context):
        await self._check_serving(context)
        try:
            memd = await self.memd.Capacity(memd_pb2.CapacityRequest(), timeout=5)
        except grpc.RpcError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"memd: {exc.details()}")
        running, waiting, _ = await self.engine.counts_and_spec()
        return modeld_pb2.CapacityResponse(memd=memd, running_requests=running, waiting_requests=waiting)


def constraint_of(request: modeld_pb2.GenerateRequest) -> Constraint | None:
    """The request's constraint (its form and size checked here; the engine compiles it)."""
    kind = request.constraint.WhichOneof("kind") if request.HasField("constraint") else None
    if kind is None:
        return None
    if kind == "json_object":
        if not request.constraint.json_object:
            raise InvalidRequest("constraint.json_object must be true when given")
        return Constraint("json_object")
    return Constraint(kind, getattr(request.constraint, kind))
