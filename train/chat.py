"""Chat formatting shared by generation and training, so the token sequences a draft trains on are the ones
the target produced.

A prompt record is {"id", "source", "turns": [user text, ...], "system": optional text}. Turn i is sent as
the chat template of the conversation so far (system, user 1, assistant 1, ..., user i) with the generation
prompt, exactly as modeld's service wraps a text prompt (`apply_chat_template(messages,
add_generation_prompt=True, tokenize=True)`); an earlier answer goes into the conversation as its decoded
text. `conversation` rebuilds the whole sequence and the answer spans from the answers' token ids.
"""


def messages(record: dict, answer_texts: list[str], upto: int) -> list[dict]:
    """The conversation for user turn `upto` (0-based): system, then user/assistant pairs, then user `upto`."""
    out = [{"role": "system", "content": record["system"]}] if record.get("system") else []
    for i in range(upto + 1):
        out.append({"role": "user", "content": record["turns"][i]})
        if i < upto:
            out.append({"role": "assistant", "content": answer_texts[i]})
    return out


def prompt_ids(tokenizer, conversation: list[dict]) -> list[int]:
    """The ids modeld's service makes of a text prompt with the chat template (here for any conversation)."""
    ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # a BatchEncoding from some tokenizer versions
        ids = ids["input_ids"]
    return list(ids)


def answer_text(tokenizer, answer: list[int]) -> str:
    return tokenizer.decode(answer, skip_special_tokens=True)


def turn_prompt(tokenizer, record: dict, answers: list[list[int]]) -> list[int]:
    """The request ids for the next user turn, given the answers to the turns before it."""
    texts = [answer_text(tokenizer, a) for a in answers]
    return prompt_ids(tokenizer, messages(record, texts, len(answers)))


def conversation(tokenizer, record: dict, answers: list[list[int]]) -> tuple[list[int], list[tuple[int, int]]]:
    """(ids, spans): the sequence of the last request plus its answer, and the [start, end) spans of the
    answers in it. An earlier answer's span is kept only where the later request holds that answer's exact ids
    (re-tokenising the decoded text almost always gives them back; where not, that span is left out)."""
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    for i in range(len(answers)):
        prompt = turn_prompt(tokenizer, record, answers[:i])
        if prompt[: len(ids)] != ids:
            spans = []
        spans.append((len(prompt), len(prompt) + len(answers[i])))
        ids = prompt + list(answers[i])
    return ids, spans
