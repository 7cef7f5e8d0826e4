"""Client-supplied strings as they may appear in a log line."""

LOG_TEXT_CHARS = 64


def loggable(text: str, limit: int = LOG_TEXT_CHARS) -> str:
    """`text` escaped (repr: no newline or control character of a client can forge or garble a log line) and cut to
    `limit` characters, saying how many more there were."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text) - limit} more characters)"
