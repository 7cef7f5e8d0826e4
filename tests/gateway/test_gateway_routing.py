"""Routing across the stack's two modelds on one memd: the least loaded takes a new prompt, and a prompt seen
before goes back to the modeld that served it while that one is not overloaded."""

from tests.gateway.streams import OpenStream

LONG = dict(max_tokens=2000, temperature=0)


def chat(model: str, text: str, **sampling) -> dict:
    return dict(model=model, messages=[{"role": "user", "content": text}], **sampling)


def test_least_loaded_spreads_concurrent_requests(stack, model_name):
    first = OpenStream(stack.url, "/v1/chat/completions", chat(model_name, "Spread one: tell a long story.", **LONG))
    first.events(2)  # running on its modeld
    second = OpenStream(stack.url, "/v1/chat/completions", chat(model_name, "Spread two: write a long poem.", **LONG))
    second.events(2)
    try:
        assert {first.modeld, second.modeld} == {0, 1}
        assert [c.info()["running_requests"] for c in stack.clients] == [1, 1]
    finally:
        first.close()
        second.close()


def test_repeated_prompt_returns_to_its_modeld(stack, model_name, openai_client):
    def served_by(text: str) -> int:
        raw = openai_client.chat.completions.with_raw_response.create(
            **chat(model_name, text, max_tokens=4, temperature=0)
        )
        return int(raw.headers["x-modeld-index"])

    prompt = "Affinity: name three colours of the rainbow, please, in order."
    home = served_by(prompt)
    busy = OpenStream(stack.url, "/v1/chat/completions", chat(model_name, "Busy: count to one thousand.", **LONG))
    busy.events(2)
    try:
        if busy.modeld != home:  # load the affine modeld, so that least-loaded alone would pick the other one
            busy.close()
            busy = OpenStream(stack.url, "/v1/chat/completions", chat(model_name, prompt + " Then more.", **LONG))
            busy.events(2)
        assert busy.modeld == home
        assert served_by(prompt) == home
        assert served_by("Elsewhere: a prompt never seen before.") != home
    finally:
        busy.close()
