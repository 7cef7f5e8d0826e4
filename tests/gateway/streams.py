"""Raw HTTP streams to the gateway, read event by event, that a test can leave open or drop mid-answer."""

import http.client
import json
import urllib.parse


class OpenStream:
    """One streaming POST; `modeld` is the index of the modeld that serves it (the x-modeld-index header)."""

    def __init__(self, base_url: str, path: str, body: dict):
        url = urllib.parse.urlsplit(base_url)
        self.connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        self.connection.request(
            "POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"}
        )
        self.reply = self.connection.getresponse()
        self.status = self.reply.status
        self.modeld = int(self.reply.headers.get("x-modeld-index", -1))

    def events(self, count: int) -> list[dict]:
        """The next `count` data events."""
        events = []
        while len(events) < count:
            line = self.reply.readline()
            assert line, "the stream ended early"
            if line.startswith(b"data: "):
                events.append(json.loads(line[len(b"data: ") :]))
        return events

    def close(self) -> None:
        """Drop the connection (a client that goes away)."""
        self.connection.close()
