"""Reading a Chrome trace file as a stream: the ``traceEvents`` array a batch of events at a time, every other
top-level key parsed whole, so that memory holds a few megabytes of the file at once, whatever its size.

The same file reads as ``reduce.trace.read_trace`` reads it: gzipped or not by its first bytes, invalid UTF-8
replaced, a bare JSON list taken as the events, a later ``traceEvents`` key replacing an earlier one, and JSON
errors, truncated gzip and files that are no trace give the same one-line GpuscopeErrors (positions in the whole
file). Events are parsed by the standard library's decoder, many at once: the text up to the last ``}, {`` between
two events in the buffer is decoded as one array; where that is not a whole number of events (the cut fell inside a
string), the events are decoded one by one instead (docs/analyze.md, "Large traces", has the measurements behind the
choice).
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from json.decoder import JSONDecodeError, scanstring
from pathlib import Path
from typing import Any, BinaryIO

from gpuscope.errors import GpuscopeError

GZIP_MAGIC = b"\x1f\x8b"
CHUNK_BYTES = 1 << 22
"""Bytes read from the file at a time."""
BATCH_CHARS = 1 << 20
"""Text decoded as one batch of events."""
RETRY_CHARS = 1 << 26
"""How far past a JSON error the text is read before the error counts: a value cut by the end of the buffer parses
once more text is in; a real error stays where it is."""

_WS = re.compile(r"[ \t\n\r]*")  # the JSON whitespace json itself skips
_NEXT_EVENT = re.compile(r"[ \t\n\r]*,[ \t\n\r]*\{")
_DECODER = json.JSONDecoder()

Progress = Callable[[int, int], None]
"""Told (bytes of the file read, its size) after each read."""


@contextmanager
def unreadable_as_one_line(path: Path) -> Iterator[None]:
    """A trace file that cannot be opened or read (missing, a folder, no permission) as a one-line GpuscopeError."""
    try:
        yield
    except FileNotFoundError:
        raise GpuscopeError(f"no such trace file: {path}") from None
    except IsADirectoryError:
        raise GpuscopeError(f"{path} is a folder, not a trace file") from None
    except OSError as exc:
        raise GpuscopeError(f"cannot read {path}: {exc.strerror}") from None


class TraceStream:
    """The events of the trace file at ``path`` in batches (``batches``), and its other top-level keys (``header``,
    complete once the batches are)."""

    def __init__(self, path: Path, progress: Progress | None = None) -> None:
        self.path = Path(path)
        self.header: dict[str, Any] = {}
        self.has_events = False
        """Whether the (last) ``traceEvents`` value was a list."""
        self._progress = progress
        self._buf = ""
        self._pos = 0
        self._base = 0  # characters of the file before _buf
        self._lines = 0  # newlines before _buf
        self._last_newline = -1  # where the last newline before _buf is
        self._comma = 0  # where in _buf the comma just passed is
        self._eof = False

    def batches(self) -> Iterator[list[Any] | None]:
        """Lists of events in file order; ``None`` means: forget the events so far (a later ``traceEvents`` key
        replaces an earlier one, as in ``json.loads``). GpuscopeError when the file cannot be read or is no trace."""
        with unreadable_as_one_line(self.path):
            raw = self.path.open("rb")
        with raw:
            self._size = _size(raw)
            self._raw = raw
            self._gzipped = raw.read(2) == GZIP_MAGIC
            raw.seek(0)
            self._file: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if self._gzipped else raw
            self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
            yield from self._document()
        if not self.has_events:
            raise GpuscopeError(f"{self.path} is not a torch.profiler trace: it has no traceEvents list")

    # -- the document ---------------------------------------------------------------------------------------------

    def _document(self) -> Iterator[list[Any] | None]:
        self._fill(1)
        if self._buf.startswith("\ufeff"):
            self._fail(JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", self._buf, 0))
        char = self._peek()
        if char == "{":
            self._pos += 1
            yield from self._object()
        elif char == "[":
            self._pos += 1
            self.has_events = True
            yield from self._array()
        else:
            self._value()  # a bare number or string is JSON, and no trace
        if self._peek():
            self._fail(JSONDecodeError("Extra data", self._buf, self._pos))

    def _object(self) -> Iterator[list[Any] | None]:
        arrays = 0
        if self._peek() == "}":
            self._pos += 1
            return
        while True:
            if self._peek() != '"':
                self._fail(JSONDecodeError("Expecting property name enclosed in double quotes", self._buf,
                                           self._pos))
            key = self._parse(lambda: scanstring(self._buf, self._pos + 1, True))
            if self._peek() != ":":
                self._fail(JSONDecodeError("Expecting ':' delimiter", self._buf, self._pos))
            self._pos += 1
            if key == "traceEvents" and self._peek() == "[":
                self._pos += 1
                if arrays:
                    yield None
                arrays += 1
                self.has_events = True
                yield from self._array()
            else:
                value = self._value()
                if key == "traceEvents":
                    self.has_events = False
                else:
                    self.header[key] = value
            char = self._peek()
            if char == "}":
                self._pos += 1
                return
            if char != ",":
                self._fail(JSONDecodeError("Expecting ',' delimiter", self._buf, self._pos))
            if self._after_comma() == "}":
                self._trailing_comma('{"a": 1,}')

    def _array(self) -> Iterator[list[Any]]:
        """The elements of the array whose ``[`` was just read, in batches, up to and past its ``]``."""
        if self._peek() == "]":
            self._pos += 1
            return
        while True:  # at the start of an element
            self._fill(BATCH_CHARS)
            buf, start = self._buf, self._pos
            cut = _last_cut(buf, start, min(len(buf), start + BATCH_CHARS))
            if cut is not None:
                try:
                    batch = json.loads("[" + buf[start:cut + 1] + "]")
                except JSONDecodeError:
                    batch = None  # the cut fell inside a string: one element at a time up to it
                if batch is not None:
                    self._pos = _NEXT_EVENT.match(buf, cut + 1).end() - 1  # type: ignore[union-attr]
                    yield batch
                    continue
            batch, done = self._elements(self._base + (cut if cut is not None else start))
            if batch:
                yield batch
            if done:
                return

    def _elements(self, until: int) -> tuple[list[Any], bool]:
        """Elements parsed one at a time, up to the first that starts past ``until`` (a position in the file) or
        the end of the array; whether the array ended."""
        batch = []
        while True:
            batch.append(self._value())
            char = self._peek()
            if char == "]":
                self._pos += 1
                return batch, True
            if char != ",":
                self._fail(JSONDecodeError("Expecting ',' delimiter", self._buf, self._pos))
            if self._after_comma() == "]":
                self._trailing_comma("[1,]")
            if self._base + self._pos > until:
                return batch, False

    def _after_comma(self) -> str:
        """Move past the comma at the current position and the whitespace after it to the next character, and
        return it ("" at the end of the file); the comma stays in the buffer (``_comma``) until the next read."""
        while True:
            end = _WS.match(self._buf, self._pos + 1).end()  # type: ignore[union-attr]
            if end < len(self._buf) or self._eof:
                break
            self._read(CHUNK_BYTES)  # keeps the text from the comma on
        self._comma, self._pos = self._pos, end
        return self._buf[end] if end < len(self._buf) else ""

    def _trailing_comma(self, example: str) -> None:
        """Fail on the comma just passed as ``json`` fails on the one in ``example`` (its message, and whether it
        points at the comma, changed in Python 3.13)."""
        try:
            json.loads(example)
        except JSONDecodeError as exc:
            at = self._comma if exc.pos == example.index(",") else self._pos
            self._fail(JSONDecodeError(exc.msg, self._buf, at))

    def _value(self) -> Any:
        """The JSON value at the current position, read whole."""
        self._peek()
        return self._parse(lambda: _DECODER.raw_decode(self._buf, self._pos))

    def _parse(self, parse: Callable[[], tuple[Any, int]]) -> Any:
        """``parse()`` at the current position, reading more text while what failed may just be cut short."""
        last = None
        while True:
            try:
                value, self._pos = parse()
            except JSONDecodeError as exc:
                where = (exc.msg, self._base + exc.pos)
                if self._eof or (where == last and len(self._buf) - exc.pos > RETRY_CHARS):
                    self._fail(exc)
                last = where
                self._read(len(self._buf) - self._pos + CHUNK_BYTES)
                continue
            self._peek()
            return value

    # -- the text -------------------------------------------------------------------------------------------------

    def _peek(self) -> str:
        """The next character that is not whitespace ("" at the end of the file), moving to it."""
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if self._eof:
                return ""
            self._read(CHUNK_BYTES)

    def _fill(self, chars: int) -> None:
        """Read until ``chars`` characters lie past the current position, or the file ends."""
        while len(self._buf) - self._pos < chars and not self._eof:
            self._read(chars)

    def _read(self, chars: int) -> None:
        """Drop the text before the current position and read at least ``chars`` more characters (or to the end)."""
        if self._pos:
            gone = self._buf[:self._pos]
            newlines = gone.count("\n")
            if newlines:
                self._lines += newlines
                self._last_newline = self._base + gone.rfind("\n")
            self._base += self._pos
            self._buf, self._pos = self._buf[self._pos:], 0
        parts = [self._buf]
        wanted = len(self._buf) + chars
        have = len(self._buf)
        while have < wanted and not self._eof:
            text = self._decode(self._chunk())
            parts.append(text)
            have += len(text)
        self._buf = "".join(parts)

    def _chunk(self) -> bytes:
        try:
            data = self._file.read(CHUNK_BYTES)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise GpuscopeError(f"{self.path} is not a readable gzip file (truncated?): {exc}") from None
        except OSError as exc:
            if self._gzipped:
                raise GpuscopeError(f"{self.path} is not a readable gzip file (truncated?): {exc}") from None
            raise GpuscopeError(f"cannot read {self.path}: {exc.strerror}") from None
        if self._progress is not None:
            self._progress(self._raw.tell(), self._size)
        return data

    def _decode(self, data: bytes) -> str:
        if not data:
            self._eof = True
            return self._text.decode(b"", final=True)
        return self._text.decode(data)

    def _fail(self, exc: JSONDecodeError) -> None:
        """A GpuscopeError naming ``exc``'s place in the whole file, as ``json.loads`` of the file would."""
        pos = self._base + exc.pos
        newline = exc.doc.rfind("\n", 0, exc.pos)
        lineno = self._lines + exc.doc.count("\n", 0, exc.pos) + 1
        colno = pos - (self._base + newline if newline >= 0 else self._last_newline)
        raise GpuscopeError(f"{self.path} is not a JSON trace (truncated, or another kind of file): "
                            f"{exc.msg}: line {lineno} column {colno} (char {pos})")


def _last_cut(buf: str, start: int, end: int) -> int | None:
    """Where the last ``}`` in ``buf[start:end]`` that a comma and a ``{`` follow is (the end of an event, most
    likely), or None."""
    while True:
        end = buf.rfind("}", start, end)
        if end < 0:
            return None
        if _NEXT_EVENT.match(buf, end + 1) is not None:
            return end


def _size(raw: BinaryIO) -> int:
    try:
        return Path(raw.name).stat().st_size  # type: ignore[arg-type]
    except (OSError, TypeError):
        return 0
