"""Request bodies, framework-neutral (docs/http-api.md#limits): read within the caps, decoded in
bounded steps off the event loop (a decompression bomb costs the cap, not its size)."""

from __future__ import annotations

import asyncio
import importlib
import zlib
from collections.abc import AsyncIterator
from typing import Any

from laya_onnx.serve.errors import (
    BODY_TIMEOUT,
    BODY_TOO_LARGE,
    BODY_UNDECODABLE,
    BUSY,
    NOT_JSON_FROM_A_PAGE,
    ApiError,
)

#: The cap on a request body, raw and decoded.
MAX_BODY_BYTES = 2 * 1024 * 1024
#: Decoded bytes produced per decompressor call: a bound on one step's memory and time.
STEP = 256 * 1024
#: What a decoder accepts (`x-gzip` is gzip's old name, RFC 9110 §8.4.1.3).
CODINGS = ("gzip", "x-gzip", "deflate", "zstd")
UNSUPPORTED_ENCODING = (
    "Content-Encoding is not supported; send the body plain (identity) or as gzip, deflate or zstd"
)
UNSUPPORTED_TRANSFER = (
    "Transfer-Encoding other than chunked is not supported; compress a body with Content-Encoding"
)


def _codings(values: list[str]) -> list[str]:
    """The codings named in every instance of a header, lower-case, in order (`a, b` -> [a, b])."""
    return [part.strip().lower() for value in values for part in value.split(",") if part.strip()]


def zstd_module() -> Any:
    try:  # Python 3.14's, else the backport the serve extra brings
        return importlib.import_module("compression.zstd")
    except ImportError:
        return importlib.import_module("backports.zstd")


class Decoder:
    """One body's streaming decompressor for `coding` (one of CODINGS)."""

    def __init__(self, coding: str):
        self.coding = "gzip" if coding == "x-gzip" else coding
        self._d: Any = None
        self._full = False  # the last step filled its limit: zlib may hold more output
        if self.coding == "gzip":
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif self.coding == "zstd":
            self._d = zstd_module().ZstdDecompressor()

    def _step(self, data: bytes, limit: int) -> bytes:
        if self._d is None:  # deflate, zlib-wrapped (RFC 1950's CM nibble is 8) or raw
            self._d = zlib.decompressobj(zlib.MAX_WBITS if data[0] & 0x0F == 8 else -zlib.MAX_WBITS)
        if self.coding == "zstd":
            return b"" if self._d.eof else self._d.decompress(data, limit)
        tail = self._d.unconsumed_tail
        out = self._d.decompress(tail + data if tail else data, limit)
        self._full = len(out) == limit and not self._d.eof
        return out

    def _pending(self) -> bool:
        """Whether input already given can still produce output without more input."""
        if self._d is None:
            return False
        if self.coding == "zstd":
            return not (self._d.eof or self._d.needs_input)
        return bool(self._d.unconsumed_tail) or self._full

    def feed(self, data: bytes, room: int) -> bytes:
        """Decode `data` after what is pending: all of it, or its first `room + 1` bytes (over the cap)."""
        if not data and not self._pending():
            return b""
        out: list[bytes] = []
        produced = 0
        try:
            while True:
                chunk = self._step(data, max(1, min(STEP, room + 1 - produced)))
                data = b""
                out.append(chunk)
                produced += len(chunk)
                if produced > room or not self._pending():
                    return b"".join(out)
        except Exception:  # zlib.error, ZstdError, EOFError: the caller's bytes
            raise ApiError(400, BODY_UNDECODABLE) from None

    def finished(self) -> bool:
        """Whether the compressed stream ended (a truncated one did not)."""
        return self._d is not None and bool(self._d.eof)


class BodyBuffer:
    """The bytes the bodies being read hold at once, against a limit (one per app, on its loop)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0

    def take(self, n: int) -> None:
        """Hold `n` more bytes (fewer when negative), or refuse the request past the limit (503)."""
        if n > 0 and self.held + n > self.limit:
            raise ApiError(503, BUSY, {"Retry-After": "1"})
        self.held += n


def check_body_size(n_bytes: int) -> None:
    """413 once a body (or the part of it read so far) is over MAX_BODY_BYTES."""
    if n_bytes > MAX_BODY_BYTES:
        raise ApiError(413, BODY_TOO_LARGE)


async def read_body(
    headers: Any, chunks: AsyncIterator[bytes], timeout: float, buffer: BodyBuffer | None
) -> bytes:
    """The decoded body, at most MAX_BODY_BYTES raw and decoded, within `timeout` s; `buffer` counts it."""
    if any(coding != "chunked" for coding in _codings(headers.getall("Transfer-Encoding", []))):
        raise ApiError(501, UNSUPPORTED_TRANSFER)
    declared = headers.get("Content-Length") or ""
    if declared.isascii() and declared.isdigit():  # a bad one is the parser's to refuse
        check_body_size(int(declared))
    codings = [c for c in _codings(headers.getall("Content-Encoding", [])) if c != "identity"]
    if len(codings) > 1 or (codings and codings[0] not in CODINGS):  # a chain, or one not read
        raise ApiError(415, UNSUPPORTED_ENCODING)
    decoder = Decoder(codings[0]) if codings else None
    held = 0

    def hold(n: int) -> None:
        nonlocal held
        if buffer is not None:
            buffer.take(n)
            held += n

    async def collect() -> bytes:
        parts: list[bytes] = []
        raw = decoded = 0
        async for chunk in chunks:
            if not chunk:
                continue
            raw += len(chunk)
            check_body_size(raw)
            hold(len(chunk))
            if decoder is not None:
                out = await asyncio.to_thread(decoder.feed, chunk, MAX_BODY_BYTES - decoded)
                hold(-len(chunk))  # the raw bytes are dropped once decoded
                decoded += len(out)
                check_body_size(decoded)
                hold(len(out))
                chunk = out
            parts.append(chunk)
        if decoder is not None and raw and not decoder.finished():
            raise ApiError(400, BODY_UNDECODABLE)
        return b"".join(parts)

    try:
        return await asyncio.wait_for(collect(), timeout)
    except asyncio.TimeoutError:
        raise ApiError(408, BODY_TIMEOUT) from None
    except ConnectionResetError:
        # the client went away mid-upload: nobody is left to answer
        raise asyncio.CancelledError() from None
    finally:
        hold(-held)


def check_page(headers: Any) -> None:
    """415 for a body a web page (`Origin`, `Sec-Fetch-Site`) sent as anything but JSON."""
    if "Origin" in headers or "Sec-Fetch-Site" in headers:
        media = (headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
            raise ApiError(415, NOT_JSON_FROM_A_PAGE)
