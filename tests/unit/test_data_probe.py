"""The data probe on small datasets defined here: it times the dataset's own lines, tells which produced float16
data, names them, and leaves the process as it found it (RNG states, trace function)."""

from __future__ import annotations

import functools
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gpuscope.collect.collectors.data_probe import DataProbeCollector, measure_float16_slowdown, probe_dataset
from gpuscope.collect.captures import PostRunFacts
from gpuscope.record import DataProbe, LineCost
from gpuscope.session import post_run_facts

HERE = Path(__file__).name
SIZE = (3, 64, 64)


def finished_run(dataset: object, data_wait: float = 0.5) -> PostRunFacts:
    """What the stage tells the probe of a finished run whose steps waited on ``dataset`` ``data_wait`` of the time."""
    return post_run_facts(data_wait=data_wait, median_s=0.1, steps=10, dataset=dataset)


class HalfImages:
    """Preprocessing done in float16 throughout."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        img = np.full(SIZE, index / 30, dtype=np.float16)
        img = (img - 0.5) / 0.25  # math: normalise
        for _ in range(3):
            img = img * 0.9 + np.exp(-img) * 0.1  # math: filter
        img *= 0.5  # math: in place
        return img, index % 10


class SingleImages:
    """The same math in float32, cast to float16 once at the end."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        img = np.full(SIZE, index / 30, dtype=np.float16).astype(np.float32)
        img = (img - 0.5) / 0.25
        for _ in range(3):
            img = img * 0.9 + np.exp(-img) * 0.1
        img *= 0.5
        return img.astype(np.float16), index % 10  # the cast


class HalfTensors:
    """float16 made with torch rather than NumPy, through a helper function."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        x = torch.ones(8, dtype=torch.float32)
        return halve(x)


def halve(x: torch.Tensor) -> torch.Tensor:
    return x.half()  # to float16


class Sleepy:
    """Its time is in a helper it calls: the calling line's own time leaves the helper's out."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        value = wait_a_little()  # the call
        return value


def wait_a_little() -> int:
    time.sleep(0.03)  # the wait
    return 1


class RandomDraws:
    """Draws from every global generator, as augmentations often do."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> float:
        return random.random() + float(np.random.rand()) + float(torch.rand(1))


class Broken:
    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int) -> None:
        raise ValueError("image 0 is missing\nsecond line")


def line_of(marker: str) -> int:
    """The line of this file that ends with ``marker`` (a comment)."""
    for number, text in enumerate(Path(__file__).read_text().splitlines(), start=1):
        if text.rstrip().endswith(marker):
            return number
    raise AssertionError(marker)


def probe(dataset: object) -> DataProbe:
    result = DataProbeCollector().run(Path("."), finished_run(dataset))
    assert result.status.status == "ok", result.status.reason
    assert isinstance(result.payload, DataProbe)
    return result.payload


def float16_lines(data: DataProbe) -> dict[int, LineCost]:
    return {c.line: c for c in data.lines if c.float16 and c.file.endswith(HERE)}


def test_float16_math_lines_are_marked_and_named() -> None:
    # when
    data = probe(HalfImages())
    # then every line that computes in float16 is marked, with its file, function and code
    lines = float16_lines(data)
    for marker in ("# math: normalise", "# math: filter", "# math: in place"):
        assert line_of(marker) in lines
    filtering = lines[line_of("# math: filter")]
    assert filtering.file.endswith(HERE) and filtering.function == "HalfImages.__getitem__"
    assert filtering.code == "img = img * 0.9 + np.exp(-img) * 0.1  # math: filter"
    # the loop's header produced nothing
    assert not any(c.float16 for c in data.lines if c.code.startswith("for "))
    assert data.dataset == "HalfImages" and data.items == 3
    # (what share of the item the float16 lines take is a timing, held in the slow tier's timed part:
    # tests/integration/test_fp16_preprocessing.py; over 3 items here, CI's fast tier once measured a third)
    assert 0 < data.float16_s <= data.item_s
    assert "line tracer" in data.note


def test_float32_math_with_a_final_cast_has_only_the_cast_on_float16() -> None:
    # when
    data = probe(SingleImages())
    # then the cast is the one line that produced float16
    assert set(float16_lines(data)) == {line_of("# the cast")}
    half = probe(HalfImages())
    assert data.float16_s / data.item_s < half.float16_s / half.item_s


def test_torch_float16_is_recognised_in_the_function_that_makes_it() -> None:
    data = probe(HalfTensors())
    assert line_of("# to float16") in float16_lines(data)
    assert float16_lines(data)[line_of("# to float16")].function == "halve"


@pytest.mark.slow  # times a dataset that sleeps
@pytest.mark.timing
def test_a_lines_own_time_leaves_out_the_user_functions_it_calls() -> None:
    data = probe(Sleepy())
    own = {c.line: c.own_s for c in data.lines if c.file.endswith(HERE)}
    assert own[line_of("# the wait")] >= 0.025
    assert own[line_of("# the call")] < 0.005
    assert data.items == 1  # a dataset of one item


def test_fetching_stops_once_over_the_time_budget() -> None:
    assert probe_dataset(HalfImages(), budget_s=0.0).items == 1


class OneFetchDescheduled:
    """Items of 0.2 ms of CPU each, but for one whose fetch loses the core for 50 ms (a busy machine's time slice)."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, index: int) -> int:
        if index == 15:  # one of the untraced fetches (items 5, 15 and 25)
            time.sleep(0.05)
            return index
        end = time.thread_time() + 2e-4
        while time.thread_time() < end:
            pass
        return index


def test_an_untraced_fetch_that_lost_its_core_does_not_set_the_items_time_or_cpu_share() -> None:
    data = probe_dataset(OneFetchDescheduled())
    # the median fetch's: 0.2 ms on the CPU, not the mean's 17 ms at 1% CPU (on a machine busy beside the test, the
    # median fetch may itself wait for a core about as long as it runs: its share stays far above the mean's)
    assert data.untraced_s is not None and data.untraced_s < 5e-3
    assert data.cpu_share is not None and data.cpu_share > 0.2


def test_the_global_random_states_are_as_before() -> None:
    # given
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    # when
    probe(RandomDraws())
    # then the next draws are those the script would have seen without the probe
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_a_dataset_that_raises_makes_the_probe_unavailable_with_its_reason() -> None:
    result = DataProbeCollector().run(Path("."), finished_run(Broken()))
    assert result.status.status == "unavailable"
    assert result.status.reason == "the dataset raised ValueError: image 0 is missing when fetched again after the run"
    assert result.payload is None


def test_no_dataset_makes_the_probe_unavailable() -> None:
    result = DataProbeCollector().run(Path("."), finished_run(None))
    assert result.status.status == "unavailable"
    assert result.status.reason == "no map-style dataset was iterated"


@pytest.mark.parametrize("dataset", [HalfImages(), Broken()], ids=["fetched", "raised"])
def test_the_previous_trace_function_is_restored(dataset: object) -> None:
    # given a trace function already set (a debugger, coverage)
    def previous(frame, event, arg):  # type: ignore[no-untyped-def]
        return None

    sys.settrace(previous)
    try:
        # when
        DataProbeCollector().run(Path("."), finished_run(dataset))
        # then
        assert sys.gettrace() is previous
    finally:
        sys.settrace(None)


@pytest.mark.slow  # probes a dataset that sleeps
@pytest.mark.timing
def test_float16_slowdown_is_measured_with_numpy_and_skipped_without(monkeypatch: pytest.MonkeyPatch) -> None:
    assert measure_float16_slowdown(np, elements=4096, repeats=2) > 0
    # a script that never imported NumPy gets no NumPy measurement
    monkeypatch.delitem(sys.modules, "numpy")
    data = probe(Sleepy())
    assert data.numpy_float16_slowdown is None


def test_a_run_that_hardly_waits_for_data_is_not_probed() -> None:
    result = DataProbeCollector().run(Path("."), finished_run(HalfImages(), data_wait=0.02))
    assert result.status.status == "unavailable"
    assert result.status.reason == "data wait was 2% of the step, under 5%: not probed"
    # just under the bar: to a tenth of a percent, not "5% of the step, under 5%"
    result = DataProbeCollector().run(Path("."), finished_run(HalfImages(), data_wait=0.049))
    assert result.status.reason == "data wait was 4.9% of the step, under 5%: not probed"


class Chatty(HalfImages):
    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        print(f"loading {index}")
        return super().__getitem__(index)


def test_what_the_dataset_prints_while_probed_is_not_shown(capsys: pytest.CaptureFixture[str]) -> None:
    result = DataProbeCollector().run(Path("."), finished_run(Chatty(), data_wait=0.6))
    assert result.status.status == "ok"
    assert capsys.readouterr() == ("", "")


# -- the loader's own collate function --------------------------------------------------------------------------

class Sentences:
    """Token lists of 5 to 305 tokens (a list of indices fetches them all)."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int | list[int]) -> Any:
        if isinstance(index, list):
            return [self[i] for i in index]
        return list(range(5 + index * 20)), index % 2


def pad_collate(batch: list[tuple[list[int], int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(tokens) for tokens, _ in batch)
    padded = []
    for tokens, _ in batch:
        padded.append([tokens[t] if t < len(tokens) else pad for t in range(longest)])  # collate: the loop
    return torch.tensor(padded), torch.tensor([label for _, label in batch])


def loader_facts(collate_fn: object, fetch: int | None = None) -> PostRunFacts:
    """A finished run whose steps waited half their time on a loader of Sentences, 8 a batch, built by
    ``collate_fn``."""
    return post_run_facts(data_wait=0.5, median_s=0.1, steps=10, dataset=Sentences(), dataset_fetch=fetch,
                          loader={"info": {"batch_size": 8}, "collate_fn": collate_fn})


def test_a_collate_function_of_the_users_own_is_timed_collating_one_batch_and_its_lines_named() -> None:
    # when
    probe = DataProbeCollector().run(Path("."), loader_facts(pad_collate)).payload
    # then: one batch of 8 collated untraced, and its lines under the tracer, the padding loop one of the two heaviest
    # (torch.tensor building the padded batch from 1,160 Python ints takes about as long: each comes first in turn)
    assert isinstance(probe, DataProbe) and probe.collate_s is not None and probe.collate_s > 0
    (loop,) = [line for line in probe.collate_lines[:2] if line.code.endswith("# collate: the loop")]
    assert loop.file.endswith(HERE) and loop.function.startswith("pad_collate")
    assert probe.collate_lines_s >= sum(line.own_s for line in probe.collate_lines) * 0.999
    # the same function behind functools.partial, or a callable object of the user's, is the user's too
    for collate in (functools.partial(pad_collate, pad=-1), PadCollator()):
        assert DataProbeCollector().run(Path("."), loader_facts(collate)).payload.collate_s, collate


class PadCollator:
    """A collate function as a callable object."""

    def __call__(self, batch: list[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return pad_collate(batch)


def test_torchs_own_collate_function_and_a_dataset_fetching_whole_batches_are_not_collated_again() -> None:
    from torch.utils.data import default_collate

    for facts in (loader_facts(default_collate), loader_facts(pad_collate, fetch=8)):
        probe = DataProbeCollector().run(Path("."), facts).payload
        assert probe.collate_s is None and probe.collate_lines == () and probe.collate_lines_s == 0.0
