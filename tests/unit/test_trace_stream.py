"""``gpuscope analyze`` reads a trace as a stream (``reduce.stream``, ``reduce.tracefile.record_from_file``) into
the same record as reading it whole (``record_from_trace(read_trace(path))``), to the last digit, on every fixture
trace; reads what ``json.loads`` reads and rejects what it rejects, in one line; and says how far it is on a large
trace."""

from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from gpuscope.commands.analyze import ReadProgress
from gpuscope.errors import GpuscopeError
from gpuscope.reduce import stream
from gpuscope.reduce.columns import REORDER_ROWS, OpIntervals
from gpuscope.reduce.optable import indexed_table, op_table, window_events
from gpuscope.reduce.stream import TraceStream
from gpuscope.reduce.trace import index_trace, parse_trace, read_trace
from gpuscope.reduce.tracefile import record_from_file, record_from_trace

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TRACES = sorted((FIXTURES / "gpu").rglob("*.json.gz")) + sorted((FIXTURES / "traces").glob("*.json*"))


def events_of(path: Path) -> list[Any]:
    """Every event of the file as the stream reads it."""
    events: list[Any] = []
    for batch in TraceStream(path).batches():
        events = [] if batch is None else events + batch
    return events


def one_line_error(call: Any) -> str:
    with pytest.raises(GpuscopeError) as caught:
        call()
    assert "\n" not in caught.value.message
    return caught.value.message


# -- the same record ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", TRACES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_the_streamed_record_is_the_whole_file_record_to_the_last_digit(path: Path) -> None:
    # given the record as it was built before streaming: the file parsed whole, the events in memory
    try:
        whole = read_trace(path)
    except GpuscopeError as exc:  # a recorded run.json beside the traces: no trace, and both say so alike
        assert one_line_error(lambda: record_from_file(path, path.name, 1)) == exc.message
        return
    expected = json.dumps(record_from_trace(whole, path.name, path.stat().st_size).to_json(), sort_keys=True)
    # when
    streamed = record_from_file(path, path.name, path.stat().st_size)
    # then
    assert json.dumps(streamed.to_json(), sort_keys=True) == expected


def test_the_fixtures_include_traces_of_every_kind() -> None:
    names = {p.name for p in TRACES}
    assert {"v100-resnet-ns.json.gz", "sampled-rank0.json.gz", "cuda_small.json", "gpt-fp32.trace.json.gz"} <= names


def test_small_reads_and_batches_cut_the_text_anywhere_and_change_nothing(monkeypatch) -> None:
    # given buffers of a few hundred characters: events, strings and UTF-8 sequences cut at every kind of place
    path = FIXTURES / "gpu" / "mi250-rocm-toy.json.gz"
    whole = read_trace(path)
    monkeypatch.setattr(stream, "CHUNK_BYTES", 97)
    monkeypatch.setattr(stream, "BATCH_CHARS", 301)
    # when
    streamed = record_from_file(path, path.name, 1)
    # then
    assert events_of(path) == whole["traceEvents"]
    assert streamed.to_json() == record_from_trace(whole, path.name, 1).to_json()


# -- what is read, as json.loads reads it ------------------------------------------------------------------------

def write(tmp_path: Path, text: str | bytes, name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_gzip_is_known_by_its_bytes_and_invalid_utf8_is_replaced_as_before(tmp_path, monkeypatch, chunk) -> None:
    # given invalid and multi-byte UTF-8 that small reads cut in two
    raw = (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k\xff\xfe\xe2\x82", "ts": 1, "dur": 2},'
           b' {"name": "\xe2\x82\xac \xf0\x9f\x98\x80 \xc3", "ph": "i"}], "other": "\xe9t\xc3\xa9"}')
    monkeypatch.setattr(stream, "CHUNK_BYTES", chunk)
    for path in (write(tmp_path, raw, "plain.json"), write(tmp_path, gzip.compress(raw), "zipped.json")):
        # when
        trace = TraceStream(path)
        events = [e for batch in trace.batches() for e in batch]  # type: ignore[union-attr]
        # then
        assert events == parse_trace(raw, "t")["traceEvents"]
        assert trace.header == {"other": parse_trace(raw, "t")["other"]}


def test_a_bare_list_of_events_is_the_events(tmp_path) -> None:
    path = write(tmp_path, '[{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2}]')
    assert events_of(path) == [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2}]


def test_the_other_keys_are_read_whole_wherever_they_are(tmp_path) -> None:
    # given keys before and after the events, one repeated (the last one counts, as in json.loads)
    text = ('{"deviceProperties": [{"id": 0, "name": "A"}], "traceEvents": [{"name": "}, {", "ph": "i"}, {}],'
            ' "distributedInfo": {"rank": 3}, "deviceProperties": [{"id": 1}]}')
    trace = TraceStream(write(tmp_path, text))
    # when
    events = [e for batch in trace.batches() for e in batch]  # type: ignore[union-attr]
    # then
    assert events == [{"name": "}, {", "ph": "i"}, {}]
    assert trace.header == {"deviceProperties": [{"id": 1}], "distributedInfo": {"rank": 3}}


def test_a_later_trace_events_key_replaces_the_first_as_in_json_loads(tmp_path) -> None:
    text = '{"traceEvents": [{"name": "a"}], "traceEvents": [{"name": "b"}]}'
    assert events_of(write(tmp_path, text)) == [{"name": "b"}] == json.loads(text)["traceEvents"]


@pytest.mark.parametrize("text", [
    "", "not a trace\n", "\ufeff{}", '{"traceEvents": [{"a": 1}] } extra', '{"traceEvents": [{"a": 1},]}',
    '{"traceEvents": [{"a": 1} {"b": 2}]}', '{"traceEvents" [1]}', '{"traceEvents": [1], 2: 3}',
    '{"traceEvents": [{"a": "\n"}]}', '{"traceEvents": [1]', '{"traceEvents": [{"a":\n\n 1}, {"b": tru}]}',
    '{"traceEvents": [], }',
], ids=["empty", "text", "bom", "extra-data", "trailing-comma", "no-comma", "no-colon", "bad-key",
        "control-character", "unclosed", "bad-literal", "trailing-comma-in-object"])
def test_json_errors_are_one_line_with_the_same_message_as_reading_whole(tmp_path, text) -> None:
    path = write(tmp_path, text)
    expected = one_line_error(lambda: read_trace(path))
    assert one_line_error(lambda: events_of(path)) == expected


@pytest.mark.parametrize("text", ['{"other": 1}', '{"traceEvents": {"a": 1}}', '"a string"', "12",
                                  '{"traceEvents": [], "traceEvents": null}'])
def test_json_that_is_no_trace_is_one_line_as_before(tmp_path, text) -> None:
    path = write(tmp_path, text)
    assert one_line_error(lambda: events_of(path)) == one_line_error(lambda: read_trace(path))


def test_a_truncated_trace_is_one_line_as_before_wherever_it_is_cut(tmp_path, monkeypatch) -> None:
    # given the small fixture cut at many places, plain and gzipped
    monkeypatch.setattr(stream, "CHUNK_BYTES", 1000)
    monkeypatch.setattr(stream, "BATCH_CHARS", 3000)
    raw = (FIXTURES / "traces" / "cuda_small.json").read_bytes()
    packed = gzip.compress(raw)
    for cut in range(1, len(raw), len(raw) // 23):
        plain = write(tmp_path, raw[:cut], "cut.json")
        assert one_line_error(lambda: events_of(plain)) == one_line_error(lambda: read_trace(plain))
        zipped = write(tmp_path, packed[:2 + cut * (len(packed) - 2) // len(raw)], "cut.json.gz")
        message = one_line_error(lambda: events_of(zipped))
        assert message == one_line_error(lambda: read_trace(zipped))
        assert "is not a readable gzip file (truncated?)" in message


def test_a_missing_file_or_a_folder_is_one_line(tmp_path) -> None:
    assert one_line_error(lambda: events_of(tmp_path / "none.json")) == f"no such trace file: {tmp_path / 'none.json'}"
    assert one_line_error(lambda: events_of(tmp_path)) == f"{tmp_path} is a folder, not a trace file"


# -- the op table of a window, from the index --------------------------------------------------------------------

def nested_ops(rng: random.Random, thread: int, start: float, end: float, depth: int, ext: list[int],
               out: list[dict[str, Any]]) -> None:
    """Ops nested in ``start``..``end`` on ``thread``, some with runtime calls and kernels under them."""
    t = start
    while t < end and depth < 4:
        dur = round(rng.choice([0.0, 0.001, 0.5, 1.0, rng.uniform(0, min(20.0, end - t))]), 3)
        if t + dur > end:
            break
        name = rng.choice(["aten::add", "aten::mean", "aten::mm", "aten::is_leaf", "## forward ##"])
        cat = "user_annotation" if name.startswith("##") else "cpu_op"
        ext[0] += 1
        out.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": thread, "ts": round(t, 3), "dur": dur,
                    "args": {"External id": ext[0]}})
        if rng.random() < 0.3:
            out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": thread,
                        "ts": round(t, 3), "dur": min(dur, 0.2), "args": {"correlation": ext[0]}})
            out.append({"ph": "X", "cat": rng.choice(["kernel", "gpu_memcpy"]), "name": f"k{ext[0] % 3}", "pid": 0,
                        "tid": 7, "ts": t + 5, "dur": 1.25, "args": {"External id": rng.choice([ext[0], 1.0 * ext[0]]),
                                                                    "correlation": ext[0]}})
        if rng.random() < 0.5:  # its own name under it: torch counts one call
            nested_ops(rng, thread, t, t + dur, depth + 1, ext, out)
        t += dur + rng.choice([0.0, 0.25, 1.0])


def scrambled_trace(seed: int) -> list[dict[str, Any]]:
    """Host events out of order as Kineto writes them and worse: runtime calls after the ops, neighbours swapped,
    some moved far back."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    ext = [0]
    for thread in (10, 11):
        nested_ops(rng, thread, 0.0, 400.0, 0, ext, events)
    events.sort(key=lambda e: e["cat"] == "cuda_runtime")
    for _ in range(len(events) // 10):
        i = rng.randrange(len(events) - 1)
        events[i], events[i + 1] = events[i + 1], events[i]
    for _ in range(5):
        moved = events.pop(rng.randrange(len(events)))
        events.insert(rng.randrange(len(events)), moved)
    return events


def spread_ids(events: list[dict[str, Any]], factor: int) -> list[dict[str, Any]]:
    """``events`` with every id multiplied by ``factor``: ids far apart, kept in a dict rather than an array."""
    spread = []
    for e in events:
        e = {**e, "args": dict(e.get("args") or {})}
        for key in ("External id", "correlation"):
            if type(e["args"].get(key)) in (int, float):
                e["args"][key] *= factor
        if type(e.get("id")) is int:
            e["id"] *= factor
        spread.append(e)
    return spread


@pytest.mark.parametrize("seed, factor", [(0, 1), (1, 1), (2, 1), (3, 10**6), (4, 10**6), (5, 1)])
def test_the_op_table_from_the_index_is_the_op_table_of_the_windows_events(seed: int, factor: int) -> None:
    # given
    events = spread_ids(scrambled_trace(seed), factor)
    index = index_trace(events)
    assert any(len(rows.runs) > 1 for rows in index.host.values())  # rows out of order beyond REORDER_ROWS
    for window in [(float("-inf"), float("inf")), (50.0, 300.0), (0.0, 0.5), (123.456, 123.457)]:
        # when
        table = indexed_table(index.host, index.device, index.names, *window)
        # then
        assert table == op_table(window_events(events, *window))


def test_ids_far_apart_give_the_same_record_as_ids_close_together() -> None:
    trace = read_trace(FIXTURES / "traces" / "cuda_small.json")
    spread = {**trace, "traceEvents": spread_ids(trace["traceEvents"], 10**9)}
    assert record_from_trace(spread, "t", 1).to_json() == record_from_trace(trace, "t", 1).to_json()


def test_a_row_a_little_out_of_order_moves_back_and_one_far_out_starts_a_run() -> None:
    # given one long op and its children; a child that starts with its parent but is written before it
    parent = {"ph": "X", "cat": "cpu_op", "name": "p", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0}
    child = {**parent, "name": "c", "dur": 1.0}
    later = [{**parent, "name": "x", "ts": 1.0 + i, "dur": 0.5} for i in range(REORDER_ROWS + 1)]
    # when
    near = index_trace([child, parent])
    far = index_trace([*later, {**parent, "ts": 0.5}])
    # then
    assert list(OpIntervals(near.host[(1, 1)])) == [(0.0, 10.0), (0.0, 1.0)] and near.host[(1, 1)].runs == [0]
    assert far.host[(1, 1)].runs == [0, REORDER_ROWS + 1]


# -- progress ----------------------------------------------------------------------------------------------------

class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("tty, quiet", [(True, False), (True, True), (False, False), (False, True)])
def test_progress_shows_after_a_few_seconds_at_most_once_a_second_on_a_terminal(tty, quiet) -> None:
    # given a read of a 5 GB trace, told every half second for a minute
    out, clock = (Terminal() if tty else io.StringIO()), Clock()
    progress = ReadProgress("trace.json.gz", quiet=quiet, stream=out, clock=clock)
    # when
    for tick in range(121):
        clock.now = tick / 2
        progress(int(5e9 * tick / 120), int(5e9))
    progress.close()
    # then
    text = out.getvalue()
    if quiet and not tty:
        assert text == ""
    elif tty:
        updates = text.split("\r")[1:-2]
        assert len(updates) == 58  # from 3 s to 60 s, once a second
        assert updates[-1].strip() == "gpuscope: reading trace.json.gz: 5.0 of 5.0 GB"
        assert text.endswith("\r" + " " * len(updates[-1]) + "\r")  # cleared at the end
    else:
        assert text.splitlines() == [f"gpuscope: reading trace.json.gz: {gb} of 5.0 GB" for gb in
                                     ("0.2", "1.1", "1.9", "2.8", "3.6", "4.4")]


def test_a_trace_read_in_a_few_seconds_shows_no_progress() -> None:
    out, clock = Terminal(), Clock()
    progress = ReadProgress("t.json", stream=out, clock=clock)
    for tick in range(6):
        clock.now = tick / 2
        progress(tick, 5)
    progress.close()
    assert out.getvalue() == ""
