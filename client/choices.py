"""n samples of one prompt (OpenAI's `n`): each is a Generate request of its own, and choices 1..n-1 start once
choice 0's first chunk came, so that its prompt is computed once and memd's prefix cache serves it to the others."""

from client import arguments

MAX_CHOICES = 16  # the gateway's limit too: each choice holds a running place in modeld
SEED_RANGE = 2**64  # the proto's seed is a uint64


def choice_count(n) -> None:
    arguments.integer("n", n, (1, MAX_CHOICES))


def choice_params(params: dict, index: int) -> dict:
    """Choice `index`'s arguments: seed + index (each choice its own stream, reproducible with a seed) and request
    id "ID-index" past the first (ids stay unique in modeld)."""
    values = dict(params)
    if index and values.get("seed") is not None:
        arguments.uint64("seed", values["seed"])
        values["seed"] = (values["seed"] + index) % SEED_RANGE
    if index and values.get("request_id"):
        values["request_id"] = f"{values['request_id']}-{index}"
    return values
