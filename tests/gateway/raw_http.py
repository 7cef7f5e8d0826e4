"""Raw HTTP/1.1 requests to the gateway over a socket, for bodies that no well-behaved client sends: a declared length
that is a lie, a chunked body without end, a body that trickles. The answer is read on a thread of its own while the
body is still being sent, as a client that reads early gets a refusal sent before its body was read."""

import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass

EARLY_ANSWER_S = 0.2  # how long a request waits for an answer to its headers before it sends its body


@dataclass
class Answer:
    status: int  # 0 when nothing came back
    headers: dict[str, str]
    body: dict | None
    sent: int  # body bytes the client could send before the gateway answered and closed
    seconds: float  # from the end of the headers to the answer


def post(base_url: str, path: str, parts, headers: dict[str, str], pause: float = 0.0, timeout: float = 30.0) -> Answer:
    """POST `parts` (bytes, sent one after the other, `pause` seconds apart) with `headers`; stops sending once the
    gateway has answered or closed the connection. The answer is read until the gateway closes the connection, as it
    does after a refusal (a request meant to be served sends `Connection: close`)."""
    url = urllib.parse.urlsplit(base_url)
    sock = socket.create_connection((url.hostname, url.port), timeout=timeout)
    received = bytearray()
    answered = threading.Event()

    def read() -> None:
        try:
            while chunk := sock.recv(65536):
                received.extend(chunk)
                if b"\r\n\r\n" in received:
                    answered.set()
        except OSError:
            pass
        answered.set()

    head = "".join(f"{name}: {value}\r\n" for name, value in {"Host": url.netloc, **headers}.items())
    sent = 0
    try:
        sock.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode())
        start = time.monotonic()
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        # A refusal on the headers alone (a declared length over the bound) comes before any body byte is sent:
        # body bytes the gateway never reads would make its close a reset, which can drop the answer unread.
        answered.wait(EARLY_ANSWER_S)
        try:
            for part in parts:
                if answered.is_set():
                    break
                sock.sendall(part)
                sent += len(part)
                if pause:
                    time.sleep(pause)
        except (BrokenPipeError, ConnectionResetError):  # the gateway answered and closed mid-body
            pass
        reader.join(timeout)
        seconds = time.monotonic() - start
    finally:
        sock.close()
    return parse(bytes(received), sent, seconds)


def parse(data: bytes, sent: int, seconds: float) -> Answer:
    if not data:
        return Answer(0, {}, None, sent, seconds)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:]))
    return Answer(int(lines[0].split()[1]), headers, json.loads(body) if body else None, sent, seconds)


def chunked(parts):
    """`parts` in HTTP/1.1 chunked framing (the terminating empty chunk last)."""
    for part in parts:
        yield f"{len(part):x}\r\n".encode() + part + b"\r\n"
    yield b"0\r\n\r\n"
