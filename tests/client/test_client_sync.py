"""The blocking Client against FakeModeld: results, streaming, retries, deadlines, cancellation."""

import time

import grpc
import pytest

from client import Chunk, Client, GenerateResult, errors
from tests.client.fake_modeld import INVALID_TEMPERATURE


def test_generate_returns_the_complete_message(fake_modeld):
    with Client(fake_modeld.address) as client:
        result = client.generate("hello", max_new_tokens=3)
    assert result == GenerateResult(
        text="hel",
        output_ids=(104, 101, 108),
        finish_reason="length",
        matched_stop="",
        prompt_tokens=5,
        completion_tokens=3,
        cached_tokens=1,
        spec_verify_ct=2,
        spec_accept_length=1.5,
        request_id="fake-1",
    )
    sampling = fake_modeld.requests[0].sampling
    assert sampling.max_new_tokens == 3 and not sampling.HasField("temperature")


def test_generate_sends_token_ids_and_every_sampling_field(fake_modeld):
    with Client(fake_modeld.address) as client:
        result = client.generate(
            input_ids=[72, 105],
            max_tokens=9,
            temperature=0.0,
            top_p=0.5,
            top_k=5,
            seed=7,
            stop="x",
            stop_token_ids=[2],
            ignore_eos=True,
            request_id="r1",
        )
    assert (result.text, result.finish_reason, result.request_id) == ("Hi", "stop", "r1")
    request = fake_modeld.requests[0]
    assert list(request.input_ids.ids) == [72, 105] and request.request_id == "r1"
    s = request.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.seed) == (9, 0.0, 0.5, 5, 7)
    assert (list(s.stop), list(s.stop_token_ids), s.ignore_eos) == (["x"], [2], True)
    assert not s.HasField("max_new_tokens")


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"prompt": "a", "input_ids": [1]},
        {"prompt": "a", "max_new_tokens": 1, "max_tokens": 1},
        {"input_ids": [1], "chat": True},
    ],
)
def test_impossible_arguments_raise_value_error_before_sending(fake_modeld, kwargs):
    with Client(fake_modeld.address) as client, pytest.raises(ValueError):
        client.generate(**kwargs)
    assert fake_modeld.attempts["Generate"] == 0


def test_stream_yields_chunks_then_holds_the_result(fake_modeld):
    with Client(fake_modeld.address) as client, client.stream("hey there", chat=True) as handle:
        chunks = list(handle)
    assert all(isinstance(chunk, Chunk) for chunk in chunks) and len(chunks) == 9
    assert "".join(chunk.text for chunk in chunks) == handle.result.text == "hey there"
    assert [t for chunk in chunks for t in chunk.token_ids] == list(handle.result.output_ids)
    assert handle.request_id == handle.result.request_id == "fake-1"
    assert fake_modeld.requests[0].apply_chat_template


def test_unavailable_is_retried_until_success(fake_modeld):
    fake_modeld.unavailable_first = 2
    with Client(fake_modeld.address, max_retries=3) as client:
        assert client.generate("ok").text == "ok"
        assert client.capacity()["running_requests"] == 2
    assert fake_modeld.attempts["Generate"] == fake_modeld.attempts["Capacity"] == 3


def test_unavailable_is_raised_after_max_retries(fake_modeld):
    fake_modeld.unavailable_first = 5
    with Client(fake_modeld.address, max_retries=1) as client, pytest.raises(errors.Unavailable) as caught:
        client.generate("ok")
    assert caught.value.code == "UNAVAILABLE" and caught.value.message == "warming up"
    assert fake_modeld.attempts["Generate"] == 2


def test_invalid_argument_is_raised_without_retry(fake_modeld):
    with Client(fake_modeld.address) as client, pytest.raises(errors.InvalidArgument) as caught:
        client.generate("ok", temperature=-1.0)
    assert str(caught.value) == f"INVALID_ARGUMENT: {INVALID_TEMPERATURE}"
    assert fake_modeld.attempts["Generate"] == 1


def test_half_streamed_generate_is_never_retried(fake_modeld):
    fake_modeld.fail_after_chunks = (1, grpc.StatusCode.UNAVAILABLE)
    received = []
    with Client(fake_modeld.address) as client, client.stream("hello") as handle:
        with pytest.raises(errors.Unavailable):
            for chunk in handle:
                received.append(chunk)
    assert [chunk.text for chunk in received] == ["h"]
    assert fake_modeld.attempts["Generate"] == 1
    with Client(fake_modeld.address) as client, pytest.raises(errors.Unavailable):
        client.generate("hello")
    assert fake_modeld.attempts["Generate"] == 2


@pytest.mark.parametrize(
    "code, error_class",
    [
        (grpc.StatusCode.NOT_FOUND, errors.NotFound),
        (grpc.StatusCode.ALREADY_EXISTS, errors.AlreadyExists),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted),
        (grpc.StatusCode.FAILED_PRECONDITION, errors.FailedPrecondition),
        (grpc.StatusCode.PERMISSION_DENIED, errors.ClientError),
    ],
)
def test_status_codes_map_to_error_classes(fake_modeld, code, error_class):
    fake_modeld.fail_with = (code, "no")
    with Client(fake_modeld.address) as client, pytest.raises(error_class) as caught:
        client.info()
    assert (type(caught.value), caught.value.code, caught.value.message) == (error_class, code.name, "no")
    assert fake_modeld.attempts["GetInfo"] == 1


def test_deadline_exceeded_within_the_timeout(fake_modeld):
    fake_modeld.pause_after_chunks = 0
    with Client(fake_modeld.address, timeout=10.0) as client:
        start = time.monotonic()
        with pytest.raises(errors.DeadlineExceeded):
            client.generate("hello", timeout=0.5)
        assert 0.4 < time.monotonic() - start < 1.5


def test_cancel_reaches_the_server_and_ends_the_stream_quietly(fake_modeld):
    fake_modeld.pause_after_chunks = 1
    with Client(fake_modeld.address) as client, client.stream("hello") as handle:
        chunks = iter(handle)
        assert next(chunks).text == "h"
        handle.cancel()
        assert list(chunks) == []
        assert handle.result is None
        assert fake_modeld.stream_cut.wait(5)


def test_leaving_the_with_block_early_cancels(fake_modeld):
    fake_modeld.pause_after_chunks = 1
    with Client(fake_modeld.address) as client:
        with client.stream("hello") as handle:
            for _ in handle:
                break
        assert fake_modeld.stream_cut.wait(5)


def test_closing_the_iteration_cancels(fake_modeld):
    fake_modeld.pause_after_chunks = 1
    with Client(fake_modeld.address) as client:
        chunks = iter(client.stream("hello"))
        next(chunks)
        chunks.close()
        assert fake_modeld.stream_cut.wait(5)


def test_abort_info_capacity(fake_modeld):
    with Client(fake_modeld.address) as client:
        client.generate("x", request_id="mine")
        assert client.abort("mine") is True
        assert client.abort("unknown") is False
        info = client.info()
        capacity = client.capacity()
    assert fake_modeld.aborted == ["mine", "unknown"]
    assert (info["target_model"], info["page_size"], info["target_tokens"]) == ("fake-target", 1, 1 << 40)
    assert capacity["memd"]["target"]["free"] == 900 and capacity["memd"]["target"]["bytes"] == 1 << 33
    assert (capacity["running_requests"], capacity["waiting_requests"]) == (2, 1)


def test_health(fake_modeld):
    with Client(fake_modeld.address) as client:
        assert client.health() == "SERVING"
        assert client.health("no.such.Service") == "NOT_FOUND"


def test_unreachable_server(nowhere):
    with Client(nowhere, connect_timeout=0.3) as client:
        start = time.monotonic()
        assert client.health() == "UNAVAILABLE"
        with pytest.raises(errors.Unavailable, match="could not connect"):
            client.capacity()
        assert time.monotonic() - start < 2
