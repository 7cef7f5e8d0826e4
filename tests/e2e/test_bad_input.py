"""docs/bad-input.md, row by row: every bad input in its table is sent (to one memd + modeld pair, to the gateway in
front of them, to a daemon's command line, or to the client library) and must get the answer and the message the
row gives; a row without a case here, or a case without a row, fails too. Then what the limits are for: refused
before any work (a long prompt is not tokenized, a huge Alloc is not walked), client strings logged escaped and cut,
and the daemons unharmed."""

import math
import pathlib
import re
import socket
import subprocess
import sys
import time

import grpc
import pytest

import client
import gateway.server
import modeld.front.server
from client.messages import build_generate_request
from memd.attach import MemdSession
from memd.log_text import LOG_TEXT_CHARS
from memd.sockets import CHANNEL_OPTIONS
from protos import memd_pb2, modeld_pb2
from tests.daemons import REPO, child_env, run_memd, run_modeld
from tests.gateway.raw_http import chunked, post
from tests.gateway.stack import run_gateway

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "bad-input.md"
CONTEXT, MAX_RUNNING, VOCAB = 1024, 4, 49152
MEMD_ARGS = [
    "--page-size",
    "1",
    "--max-running-requests",
    str(MAX_RUNNING),
    "--max-total-tokens",
    "8192",
    "--context-length",
    str(CONTEXT),
    "--draft-model",
    "none",
    "--kv-cache-dtype",
    "float32",
    "--strict",
]
NOT_UTF8 = b"\xff\xfe"
GATEWAY_BODY_TIMEOUT = 1.0
BROKEN_JSON = b'{"model": "m",, "messages": []}'
TINY_TOP_P = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_p": 1e-300}'
NO_SCHEMA = (
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema"}}'
)


def doc_rows() -> dict[str, tuple[str, str]]:
    """case -> (answer, message) from the table: rows `| `case` | what is sent | answer | `message` |`."""
    rows = {}
    for line in DOC.read_text().splitlines():
        if line.startswith("| `"):
            case, _, answer, message = (cell.strip().strip("`") for cell in line.strip("|").split(" | "))
            assert case not in rows, f"row {case} appears twice"
            rows[case] = (answer, message)
    return rows


class Daemons:
    def __init__(self, memd, modeld, session: MemdSession, gateway_url: str):
        self.memd, self.modeld, self.session, self.gateway_url = memd, modeld, session, gateway_url
        self.modeld_channel = grpc.insecure_channel(modeld.address)
        self.memd_channel = grpc.insecure_channel(memd.address, options=CHANNEL_OPTIONS)

    def raw(self, channel, method: str, data: bytes, streaming: bool) -> tuple[str, str]:
        """The answer to serialized request bytes: the status code name and details, or OK."""
        call = (channel.unary_stream if streaming else channel.unary_unary)(method)
        try:
            reply = call(data, timeout=30)
            if streaming:
                next(iter(reply))
                reply.cancel()
        except grpc.RpcError as exc:
            return exc.code().name, exc.details()
        return "OK", ""

    def generate(self, request: modeld_pb2.GenerateRequest | bytes) -> tuple[str, str]:
        data = request if isinstance(request, bytes) else request.SerializeToString()
        return self.raw(self.modeld_channel, "/modeld.v1.Modeld/Generate", data, streaming=True)

    def memd_call(self, method: str, request) -> tuple[str, str]:
        data = request if isinstance(request, bytes) else request.SerializeToString()
        return self.raw(self.memd_channel, f"/memd.v1.Memd/{method}", data, streaming=method == "Attach")

    def gateway(self, parts, headers: dict[str, str], pause: float = 0.0) -> tuple[str, str]:
        """The gateway's answer to a chat request of `parts`: "HTTP <status>" and its error message."""
        answer = post(
            self.gateway_url,
            "/v1/chat/completions",
            parts,
            {"Content-Type": "application/json", **headers},
            pause=pause,
        )
        return f"HTTP {answer.status}", (answer.body or {}).get("error", {}).get("message", "")

    def close(self) -> None:
        self.modeld_channel.close()
        self.memd_channel.close()


@pytest.fixture(scope="module")
def daemons(default_model):
    with (
        run_memd(default_model, *MEMD_ARGS) as memd_process,
        run_modeld(memd_process, "--target-model", str(default_model)) as modeld_process,
        run_gateway(modeld_process.address, args=("--body-timeout", str(GATEWAY_BODY_TIMEOUT))) as gateway_url,
        MemdSession(memd_process.address, "bad-input") as session,
    ):
        env = Daemons(memd_process, modeld_process, session, gateway_url)
        yield env
        env.close()


def gen(**kwargs) -> modeld_pb2.GenerateRequest:
    return build_generate_request(**{"prompt": "hi", "max_new_tokens": 4, **kwargs})


def rid(n: int) -> str:
    return "r" * n


def alloc(session_id: str = "nope", extends=(), **release) -> memd_pb2.AllocRequest:
    return memd_pb2.AllocRequest(
        session_id=session_id,
        release=memd_pb2.FreeRequest(**release),
        extends=[memd_pb2.ExtendOp(rid=r, num_tokens=n) for r, n in extends],
    )


def modeld_exit(*flags: str) -> tuple[str, str]:
    """modeld's main() in this process (its imports take seconds): "exit 1" and the message it exits with."""
    argv = ["--device", "cpu", "--listen", "127.0.0.1:0", "--memd", "127.0.0.1:1", "--connect-timeout", "1", *flags]
    with pytest.raises(SystemExit) as exited:
        modeld.front.server.main(argv)
    code = exited.value.code
    return ("exit 1", code) if isinstance(code, str) else (f"exit {code}", "")


def memd_exit(*flags: str) -> tuple[str, str]:
    """memd started with these flags (a process of its own: memd starts in a fraction of a second)."""
    proc = subprocess.run(
        [sys.executable, "-m", "memd", "--device", "cpu", "--listen", "127.0.0.1:0", *flags],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO,
        timeout=30,
    )
    return f"exit {proc.returncode}", proc.stderr.strip().splitlines()[-1]


def gateway_exit(*flags: str) -> tuple[str, str]:
    """The gateway's main() in this process: "exit 1" and the message it exits with."""
    with pytest.raises(SystemExit) as exited:
        gateway.server.main(["--modeld", "127.0.0.1:1", *flags])
    code = exited.value.code
    return ("exit 1", code) if isinstance(code, str) else (f"exit {code}", "")


def chat_body(size: int):
    """A chat request of `size` bytes (its user turn padded), in parts of 1 MiB, made as it is sent."""
    head, tail = b'{"model": "m", "messages": [{"role": "user", "content": "', b'"}]}'
    left = size - len(head) - len(tail)
    yield head
    while left > 0:
        yield b"x" * min(1 << 20, left)
        left -= 1 << 20
    yield tail


def memd_metrics_port_in_use() -> tuple[str, str]:
    """memd asked to serve metrics on a port another socket holds."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        return memd_exit("--metrics-port", str(held.getsockname()[1]), *MEMD_ARGS)


def modeld_metrics_port_in_use() -> tuple[str, str]:
    """modeld asked to serve metrics on a port another socket holds (refused before its engine starts)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        return modeld_exit("--metrics-port", str(held.getsockname()[1]))


def modeld_port_in_use() -> tuple[str, str]:
    """modeld asked to listen on a TCP port another socket holds (refused before its engine starts: memd's address
    here is nobody's, so an engine start would fail on that instead)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        return modeld_exit("--listen", f"127.0.0.1:{held.getsockname()[1]}")


def client_refusal(call) -> tuple[str, str]:
    """A client-side refusal: nothing is sent (the address is never dialled)."""
    with pytest.raises(client.BadArgument) as refused:
        call()
    assert isinstance(refused.value, ValueError) and isinstance(refused.value, client.InvalidArgument)
    return "BadArgument", refused.value.message


def nowhere(**settings):
    return client.Client("unix:///nonexistent/modeld.sock", **settings)


CASES = {
    # modeld: Generate and Abort
    "text-not-utf8": lambda env: env.generate(b"\x12\x02" + NOT_UTF8),
    "text-too-long": lambda env: env.generate(gen(prompt="x" * 1_000_000)),
    "input-ids-too-many": lambda env: env.generate(gen(prompt=None, input_ids=[1] * (CONTEXT + 1))),
    "input-id-negative": lambda env: env.generate(gen(prompt=None, input_ids=[1, -1])),
    "input-id-outside-vocabulary": lambda env: env.generate(gen(prompt=None, input_ids=[1, VOCAB])),
    "prompt-missing": lambda env: env.generate(modeld_pb2.GenerateRequest()),
    "messages-too-many": lambda env: env.generate(
        modeld_pb2.GenerateRequest(
            messages=modeld_pb2.ChatMessages(messages=[modeld_pb2.ChatMessage(role="user")] * 100_000)
        )
    ),
    "prompt-empty": lambda env: env.generate(gen(prompt="")),
    "prompt-and-output-beyond-context": lambda env: env.generate(gen(max_new_tokens=CONTEXT)),
    "request-id-too-long": lambda env: env.generate(gen(request_id=rid(257))),
    "request-id-control-character": lambda env: env.generate(gen(request_id="a\nb")),
    "stop-too-many": lambda env: env.generate(gen(stop=[f"s{i}" for i in range(17)])),
    "stop-too-long": lambda env: env.generate(gen(stop=["s" * 257])),
    "stop-empty": lambda env: env.generate(gen(stop=[""])),
    "stop-token-ids-too-many": lambda env: env.generate(gen(stop_token_ids=list(range(257)))),
    "stop-token-id-negative": lambda env: env.generate(gen(stop_token_ids=[2, -1])),
    "stop-token-id-outside-vocabulary": lambda env: env.generate(gen(stop_token_ids=[VOCAB])),
    "max-new-tokens-zero": lambda env: env.generate(gen(max_new_tokens=0)),
    "max-tokens-and-max-new-tokens": lambda env: env.generate(
        modeld_pb2.GenerateRequest(text="hi", sampling=modeld_pb2.SamplingParams(max_new_tokens=4, max_tokens=4))
    ),
    "temperature-negative": lambda env: env.generate(gen(temperature=-1.0)),
    "temperature-nan": lambda env: env.generate(gen(temperature=math.nan)),
    "temperature-infinite": lambda env: env.generate(gen(temperature=math.inf)),
    "top-p-zero": lambda env: env.generate(gen(top_p=0.0)),
    "top-k-negative": lambda env: env.generate(gen(top_k=-1)),
    "top-logprobs-too-many": lambda env: env.generate(gen(logprobs=True, top_logprobs=21)),
    "top-logprobs-without-logprobs": lambda env: env.generate(gen(top_logprobs=2)),
    "constraint-schema-not-json": lambda env: env.generate(gen(json_schema="{not json")),
    "constraint-schema-not-object": lambda env: env.generate(gen(json_schema="[1, 2]")),
    "constraint-schema-unsupported": lambda env: env.generate(gen(json_schema={"type": "frobnicate"})),
    "constraint-regex-bad": lambda env: env.generate(gen(regex="(yes|no")),
    "constraint-too-large": lambda env: env.generate(gen(regex="a" * (65 << 10))),
    "constraint-with-ignore-eos": lambda env: env.generate(gen(json_object=True, ignore_eos=True)),
    "generate-too-large": lambda env: env.generate(gen(prompt="x" * (65 << 20))),
    "abort-id-too-long": lambda env: env.raw(
        env.modeld_channel,
        "/modeld.v1.Modeld/Abort",
        modeld_pb2.AbortRequest(request_id=rid(257)).SerializeToString(),
        False,
    ),
    # memd
    "memd-client-name-too-long": lambda env: env.memd_call("Attach", memd_pb2.AttachRequest(client_name="n" * 257)),
    "memd-client-name-not-utf8": lambda env: env.memd_call("Attach", b"\x0a\x02" + NOT_UTF8),
    "memd-session-id-too-long": lambda env: env.memd_call("Alloc", alloc(session_id="s" * 257)),
    "memd-model-fingerprint-too-long": lambda env: env.memd_call(
        "Attach", memd_pb2.AttachRequest(model_fingerprint="f" * 257)
    ),
    "memd-session-unknown": lambda env: env.memd_call("Alloc", alloc(extends=[("a", 1)])),
    "memd-request-id-too-long": lambda env: env.memd_call("Alloc", alloc(extends=[(rid(257), 1)])),
    "memd-too-many-extends": lambda env: env.memd_call("Alloc", alloc(extends=[(f"r{i}", 1) for i in range(5)])),
    "memd-too-many-finishes": lambda env: env.memd_call(
        "Free", memd_pb2.FreeRequest(session_id="nope", finish=[f"r{i}" for i in range(5)])
    ),
    "memd-num-tokens-negative": lambda env: env.memd_call("Alloc", alloc(env.session.session_id, extends=[("a", -3)])),
    "memd-beyond-context": lambda env: env.memd_call(
        "Alloc", alloc(env.session.session_id, extends=[("a", CONTEXT + 1)])
    ),
    "memd-match-beyond-context": lambda env: env.memd_call(
        "MatchPrefix",
        memd_pb2.MatchPrefixRequest(session_id=env.session.session_id, rid="m", token_ids=[1] * (CONTEXT + 1)),
    ),
    "memd-match-extend-beyond-context": lambda env: env.memd_call(
        "MatchPrefix",
        memd_pb2.MatchPrefixRequest(
            session_id=env.session.session_id, rid="m", token_ids=[1, 2, 3], extend_to=CONTEXT + 1
        ),
    ),
    "memd-match-batch-too-many": lambda env: env.memd_call(
        "MatchPrefixBatch",
        memd_pb2.MatchPrefixBatchRequest(
            session_id=env.session.session_id, items=[memd_pb2.MatchItem(rid=f"m{i}", token_ids=[1]) for i in range(5)]
        ),
    ),
    "memd-match-batch-repeated-rid": lambda env: env.memd_call(
        "MatchPrefixBatch",
        memd_pb2.MatchPrefixBatchRequest(
            session_id=env.session.session_id, items=[memd_pb2.MatchItem(rid="m", token_ids=[1, 2])] * 2
        ),
    ),
    "memd-match-batch-extend-beyond-context": lambda env: env.memd_call(
        "MatchPrefixBatch",
        memd_pb2.MatchPrefixBatchRequest(
            session_id=env.session.session_id,
            items=[
                memd_pb2.MatchItem(rid="m", token_ids=[1, 2]),
                memd_pb2.MatchItem(rid="n", token_ids=[1], extend_to=CONTEXT + 1),
            ],
        ),
    ),
    "memd-translate-too-many": lambda env: env.memd_call(
        "Translate", memd_pb2.TranslateRequest(target_slots=[1] * (MAX_RUNNING * CONTEXT + 1))
    ),
    "memd-translate-without-draft": lambda env: env.memd_call("Translate", memd_pb2.TranslateRequest(target_slots=[1])),
    "memd-message-too-large": lambda env: env.memd_call("Alloc", alloc(extends=[(rid(5 << 20), 1)])),
    # start-up
    "memd-listen-port-out-of-range": lambda env: memd_exit("--listen", "127.0.0.1:99999"),
    "memd-listen-bogus": lambda env: memd_exit("--listen", "bogus"),
    "memd-context-length-zero": lambda env: memd_exit("--context-length", "0"),
    "memd-context-length-negative": lambda env: memd_exit("--context-length", "-1"),
    "memd-context-length-not-a-number": lambda env: memd_exit("--context-length", "abc"),
    "memd-socket-in-use": lambda env: memd_exit("--listen", env.memd.address, *MEMD_ARGS),
    "memd-listen-relative": lambda env: memd_exit("--listen", "unix://relative/memd.sock"),
    "memd-metrics-port-in-use": lambda env: memd_metrics_port_in_use(),
    "modeld-listen-port-out-of-range": lambda env: modeld_exit("--listen", "127.0.0.1:99999"),
    "modeld-listen-bogus": lambda env: modeld_exit("--listen", "bogus"),
    "modeld-socket-in-use": lambda env: modeld_exit("--listen", env.modeld.address),
    "modeld-port-in-use": lambda env: modeld_port_in_use(),
    "modeld-metrics-port-in-use": lambda env: modeld_metrics_port_in_use(),
    "modeld-listen-relative": lambda env: modeld_exit("--listen", "unix:relative/modeld.sock"),
    "modeld-memd-port-zero": lambda env: modeld_exit("--memd", "127.0.0.1:0"),
    "modeld-connect-timeout-zero": lambda env: modeld_exit("--connect-timeout", "0"),
    # the gateway
    "gateway-body-declared-too-large": lambda env: env.gateway(chat_body(100_000_000), {"Content-Length": "100000000"}),
    "gateway-body-chunked-too-large": lambda env: env.gateway(
        chunked(chat_body(100_000_000)), {"Transfer-Encoding": "chunked"}
    ),
    "gateway-top-p-below-float32": lambda env: env.gateway([TINY_TOP_P], {"Content-Length": str(len(TINY_TOP_P))}),
    "gateway-json-syntax-error": lambda env: env.gateway([BROKEN_JSON], {"Content-Length": str(len(BROKEN_JSON))}),
    "gateway-response-format-without-schema": lambda env: env.gateway(
        [NO_SCHEMA], {"Content-Length": str(len(NO_SCHEMA))}
    ),
    "gateway-body-too-slow": lambda env: env.gateway(
        chunked(b" " for _ in range(1000)), {"Transfer-Encoding": "chunked"}, pause=0.05
    ),
    "gateway-max-body-bytes-zero": lambda env: gateway_exit("--max-body-bytes", "0"),
    "gateway-body-timeout-zero": lambda env: gateway_exit("--body-timeout", "0"),
    "gateway-max-queued-negative": lambda env: gateway_exit("--max-queued", "-1"),
    "gateway-queue-timeout-zero": lambda env: gateway_exit("--queue-timeout", "0"),
    # the client library
    "client-prompt-and-input-ids": lambda env: client_refusal(lambda: build_generate_request("hi", input_ids=[1])),
    "client-max-new-tokens-overflow": lambda env: client_refusal(
        lambda: nowhere().generate("hi", max_new_tokens=2**31)
    ),
    "client-seed-negative": lambda env: client_refusal(lambda: nowhere().generate("hi", seed=-1)),
    "client-temperature-not-a-number": lambda env: client_refusal(lambda: nowhere().generate("hi", temperature="hot")),
    "client-input-id-overflow": lambda env: client_refusal(lambda: nowhere().stream(input_ids=[1, 2**31])),
    "client-prompt-lone-surrogate": lambda env: client_refusal(lambda: nowhere().generate("\ud800")),
    "client-stop-not-text": lambda env: client_refusal(lambda: nowhere().generate("hi", stop=[1])),
    "client-timeout-negative": lambda env: client_refusal(lambda: nowhere(timeout=-1)),
    "client-max-retries-negative": lambda env: client_refusal(lambda: nowhere(max_retries=-1)),
}


def test_every_row_has_a_case_and_every_case_a_row():
    rows = doc_rows()
    assert sorted(set(rows) - set(CASES)) == [], "rows of docs/bad-input.md that no test sends"
    assert sorted(set(CASES) - set(rows)) == [], "bad inputs sent here that docs/bad-input.md does not list"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_answer_is_the_documented_one(daemons, case):
    answer, message = doc_rows()[case]
    got, details = CASES[case](daemons)
    assert got == answer and message in details, f"{case}: got {got}: {details}"


def test_a_long_prompt_is_refused_before_it_is_tokenized(daemons):
    start = time.monotonic()
    assert daemons.generate(gen(prompt="word " * 1_000_000))[0] == "INVALID_ARGUMENT"  # 5 MB
    assert time.monotonic() - start < 1.0  # tokenizing it takes seconds


def test_a_json_syntax_error_names_no_field(daemons):
    """The offset of a JSON syntax error is in the message, not in `param` (which names a request field)."""
    answer = post(
        daemons.gateway_url,
        "/v1/chat/completions",
        [BROKEN_JSON],
        {"Content-Type": "application/json", "Content-Length": str(len(BROKEN_JSON))},
    )
    assert answer.status == 400 and answer.body["error"]["param"] is None, answer.body


def test_an_alloc_of_many_ops_is_refused_before_any_work(daemons):
    request = alloc(daemons.session.session_id, extends=[(str(i), 1) for i in range(100_000)])
    start = time.monotonic()
    code, details = daemons.memd_call("Alloc", request)
    assert (code, time.monotonic() - start < 1.0) == ("INVALID_ARGUMENT", True), details
    assert "100000 extends and grows: at most 4" in details


def test_client_strings_are_logged_escaped_and_cut(daemons):
    name = "evil\n2026-01-01 memd INFO forged line \x1b[31m" + "x" * 150  # within the bound of 256
    with MemdSession(daemons.memd.address, name):
        pass
    assert daemons.memd_call("Attach", memd_pb2.AttachRequest(client_name="y" * 1_000_000))[0] == "INVALID_ARGUMENT"
    log = daemons.memd.log()
    attached = [line for line in log.splitlines() if "attached ('evil" in line]
    assert len(attached) == 1, log[-2000:]
    assert r"'evil\n2026-01-01 memd INFO forged line \x1b[31m" in attached[0]
    assert attached[0].endswith(f"... ({len(name) - LOG_TEXT_CHARS} more characters))")
    assert not re.search(r"^2026-01-01 memd INFO forged line", log, re.M) and "\x1b" not in log
    assert "x" * 100 not in log and "y" * 100 not in log


def test_the_daemons_still_serve_and_memd_is_idle(daemons):
    with client.Client(daemons.modeld.address, timeout=60) as c:
        result = c.generate("What is the capital of France?", chat=True, max_new_tokens=4, temperature=0)
    assert result.completion_tokens > 0
    daemons.memd.wait_idle()
