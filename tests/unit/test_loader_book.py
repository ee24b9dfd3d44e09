"""What the record says of each DataLoader the loop iterated, read off its iterator: the workers' start method,
whichever way the script chose it, and the restarts of its workers for each new iterator."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from gpuscope.collect.steps.loaders import LoaderBook
from gpuscope.collect.steps.steplog import StepLog, StepTracker


def iterator_with(worker: Any) -> SimpleNamespace:
    """What a two-worker DataLoader's iterator shows of itself (torch's private attributes), one worker given."""
    return SimpleNamespace(_dataset=[1, 2, 3], _num_workers=2, _workers=[worker], _batch_size=1)


def start_method_recorded(worker: Any) -> str | None:
    book = LoaderBook()
    book.count_batch(iterator_with(worker), batch=[1], wait_s=0.01)
    return book.records()[0].start_method


@pytest.fixture
def default_start_method() -> Iterator[None]:
    """The process's default start method, put back after the test."""
    before = multiprocessing.get_start_method(allow_none=True)
    yield
    multiprocessing.set_start_method(before, force=True)


def test_a_loader_given_a_multiprocessing_context_records_its_method() -> None:
    worker = multiprocessing.get_context("forkserver").Process()  # DataLoader(..., multiprocessing_context=...)
    assert start_method_recorded(worker) == "forkserver"


def test_a_loader_on_the_default_context_records_the_method_the_script_set(default_start_method: None) -> None:
    # torch.multiprocessing.set_start_method("spawn") at the top of main(), as pytorch/examples' scripts do:
    # the workers are plain Process objects of the default context
    multiprocessing.set_start_method("spawn", force=True)
    assert start_method_recorded(multiprocessing.Process()) == "spawn"


class EpochIterator:
    """A DataLoader iterator as the book sees it: a new one each epoch (no persistent workers), workers or not."""

    def __init__(self, dataset: list[int], workers: int) -> None:
        self._dataset, self._num_workers, self._workers, self._batch_size = dataset, workers, [], 1


@pytest.mark.parametrize(("workers", "restarts", "waited"), [(2, 2, 3.0), (0, 0, 0.0)])
def test_each_new_iterator_of_a_loader_with_workers_is_a_restart_with_its_first_wait(workers: int, restarts: int,
                                                                                     waited: float) -> None:
    # given: three epochs of three batches; each epoch's first batch waits 1.5 s (the workers' start-up)
    book, dataset = LoaderBook(), [1, 2, 3]
    for _ in range(3):
        iterator = EpochIterator(dataset, workers)
        for i in range(3):
            book.count_batch(iterator, batch=[1], wait_s=1.5 if i == 0 else 0.01)
    # then: the first epoch's start is no restart; with no workers nothing restarts at all
    loader = book.records()[0]
    assert (loader.batches, loader.restarts, loader.restart_wait_s) == (9, restarts, pytest.approx(waited))



def test_iterators_taken_from_in_turn_count_each_its_own_batches_and_restart_only_when_new() -> None:
    # given: a training and a validation iterator, each with two workers, taken from in turn (a loop validating a
    # batch after each training batch), then a new training iterator (the next epoch)
    book, train_data, test_data = LoaderBook(), [1, 2, 3], [4, 5]
    train, test = EpochIterator(train_data, 2), EpochIterator(test_data, 2)
    for _ in range(3):
        book.count_batch(train, batch=[1], wait_s=0.01)
        book.count_batch(test, batch=[4], wait_s=0.02)
    book.count_batch(EpochIterator(train_data, 2), batch=[1], wait_s=1.5)
    # then: each loader has its own batches and waits, and only the new iterator is a restart
    by_batches = sorted((r.batches, r.restarts, round(r.wait_s, 2)) for r in book.records())
    assert by_batches == [(3, 0, 0.06), (4, 1, 1.53)]


class Buckets(list):
    """A user's batch sampler: fixed batches of indices (a list, so unhashable)."""

    batch_size = 2


class Items(list):
    """A map-style dataset of four items (with weak references, as a Dataset subclass has)."""


def loader_recorded(*made: dict[str, Any]) -> tuple[int | None, str]:
    """The batch size and batch sampler recorded for DataLoaders built over one dataset through the book's
    DataLoader.__init__ (as a script, then a library, builds them) with each of ``made``'s arguments in turn, the
    last one iterated."""
    from torch.utils.data import DataLoader
    book, data = LoaderBook(), Items(range(4))
    init = book.wrap_init(DataLoader.__init__)
    for kwargs in made:
        loader = DataLoader.__new__(DataLoader)
        init(loader, data, **kwargs)
    iterator = iter(loader)
    book.count_batch(iterator, next(iterator), wait_s=0.01)
    (record,) = book.records()
    return record.batch_size, record.batch_sampler


def test_a_batch_sampler_the_script_passed_is_named_with_its_batch_size() -> None:
    from torch.utils.data import BatchSampler
    assert loader_recorded({"batch_size": 2}) == (2, "")
    assert loader_recorded({"batch_sampler": Buckets([[0, 1], [2, 3]])}) == (2, "Buckets")
    assert loader_recorded({"batch_sampler": BatchSampler(range(4), 2, False)}) == (2, "BatchSampler")


def test_a_library_that_builds_the_loader_again_with_a_batch_sampler_leaves_the_scripts_batch_size() -> None:
    # accelerate's prepare() builds the script's DataLoader(batch_size=2) again with batch_sampler=: the fix goes
    # on the script's line, which has a batch_size
    from torch.utils.data import BatchSampler
    assert loader_recorded({"batch_size": 2}, {"batch_sampler": BatchSampler(range(4), 2, False)}) == (2, "")


def test_batches_asked_for_right_after_the_previous_one_arrived_are_counted_back_to_back() -> None:
    # given: a step takes four batches at once (asked for 0.2 ms after the previous one came), then computes 40 ms
    book, iterator = LoaderBook(), iterator_with(multiprocessing.Process())
    now = 0.0
    for _ in range(3):
        for taken in range(4):
            now += 0.0002 if taken else 0.04
            book.count_batch(iterator, batch=[1], wait_s=0.005, requested=now)
            now += 0.005
    # then three of each four are back to back
    (record,) = book.records()
    assert (record.batches, record.back_to_back) == (12, 9)


def test_batches_taken_in_a_step_that_held_an_evaluation_pass_count_apart_and_the_training_loader_comes_first() -> None:
    # given: a training loader waited 10 ms a batch over 3 steps; between them a test loader waited 500 ms a batch
    # for 2 batches in a step that held an evaluation pass
    book = LoaderBook()
    train, test = EpochIterator([1, 2, 3], 0), EpochIterator([4, 5], 0)
    for _ in range(3):
        book.count_batch(train, batch=[1], wait_s=0.01)
        book.step_closed(evaluated=False)
    book.count_batch(train, batch=[1], wait_s=0.01)
    book.count_batch(test, batch=[4], wait_s=0.5)
    book.count_batch(test, batch=[5], wait_s=0.5)
    book.step_closed(evaluated=True)
    # then: the test loader's whole wait is evaluation; the training loader's is not, the batch its iterator gave
    # in the step that also evaluated included (it fed training: Lightning's val_check_interval validates inside a
    # step of 4 accumulated batches, and those were taken for 3.28 a step)
    first, second = book.records()
    assert (first.batches, first.eval_batches, first.wait_s, first.eval_wait_s) == pytest.approx((4, 0, 0.04, 0.0))
    assert (second.batches, second.eval_batches, second.eval_wait_s) == pytest.approx((2, 2, 1.0))
    # and the probes are given the training loader, with its training batches
    probed = book.probe_loader()
    assert probed is not None and probed["dataset"] == [1, 2, 3]
    assert (probed["batches"], probed["wait_s"]) == pytest.approx((4, 0.04))


def test_an_evaluation_pass_over_the_training_loader_itself_counts_as_evaluation() -> None:
    # given: a loop that evaluates on its training loader, through a new iterator of it, inside a step
    book = LoaderBook()
    dataset = [1, 2, 3, 4, 5]
    train = EpochIterator(dataset, 0)
    for _ in range(2):
        book.count_batch(train, batch=[1], wait_s=0.01)
        book.step_closed(evaluated=False)
    book.count_batch(train, batch=[1], wait_s=0.01)
    again = EpochIterator(dataset, 0)  # the evaluation's pass over the same loader
    book.count_batch(again, batch=[1], wait_s=0.2)
    book.count_batch(again, batch=[2], wait_s=0.2)
    book.step_closed(evaluated=True)
    book.count_batch(train, batch=[1], wait_s=0.01)  # training goes on with its own iterator
    book.step_closed(evaluated=False)
    # then: the evaluation's two batches count apart, the training iterator's four do not
    (record,) = book.records()
    assert (record.batches, record.eval_batches, record.eval_wait_s) == pytest.approx((6, 2, 0.4))


def test_a_new_epochs_first_batches_taken_in_the_step_that_evaluated_count_as_training() -> None:
    # given: the Transformers Trainer's epoch end: the step after the epoch's last update evaluates (8 batches of
    # the evaluation loader), then takes the next epoch's first 2 batches through a new iterator, which goes on
    # feeding the steps after it
    book = LoaderBook()
    dataset, held_out = [1, 2, 3, 4], [5, 6]
    first = EpochIterator(dataset, 0)
    for _ in range(3):
        book.count_batch(first, batch=[1], wait_s=0.01)
        book.step_closed(evaluated=False)
    evaluation, second = EpochIterator(held_out, 0), EpochIterator(dataset, 0)
    for _ in range(8):
        book.count_batch(evaluation, batch=[5], wait_s=0.05)
    for _ in range(2):
        book.count_batch(second, batch=[1], wait_s=0.01)
    book.step_closed(evaluated=True)
    book.count_batch(second, batch=[1], wait_s=0.01)
    book.step_closed(evaluated=False)
    # then: the training loader's 6 batches are training, the evaluation loader's 8 are evaluation
    by_size = {record.batches: record for record in book.records()}
    assert by_size[6].eval_batches == 0 and by_size[8].eval_batches == 8


def test_the_book_hears_of_the_spans_that_counted_batches_and_a_loop_without_batches_tells_it_nothing() -> None:
    # given: a book following the step tracker of a loop that takes no batches (a manual loop, backward-defined)
    book, tracker = LoaderBook(), StepTracker(0.0, StepLog())
    book.follow(tracker)
    for step in range(3):
        tracker.optimizer_stepped(1, float(step))
    # then: the tracker has no one to tell at the end of each step (its hot path stays short)
    assert tracker.on_span_end is None
    # when: a test pass takes two batches in a step that holds an evaluation pass, then a training step takes one
    test, train = EpochIterator([4, 5], 0), EpochIterator([1, 2, 3], 0)
    book.count_batch(test, batch=[4], wait_s=0.5)
    book.count_batch(test, batch=[5], wait_s=0.5)
    tracker.evaluation_forward()
    tracker.optimizer_stepped(1, 3.0)
    book.count_batch(train, batch=[1], wait_s=0.01)
    tracker.optimizer_stepped(1, 4.0)
    # then: each span's batches were counted as its own, and the tracker is left with no one to tell again
    assert {(r.batches, r.eval_batches) for r in book.records()} == {(2, 2), (1, 0)}
    assert tracker.on_span_end is None


def test_with_a_thread_taking_the_batches_the_book_hears_of_every_span() -> None:
    # given: a prefetching thread took a batch (the loop's thread never counts one)
    book, tracker = LoaderBook(), StepTracker(0.0, StepLog())
    book.follow(tracker)
    book.fed_by_thread = True
    book.count_batch(EpochIterator([1, 2], 0), batch=[1], wait_s=0.01)
    # when: steps end, one holding an evaluation pass
    tracker.optimizer_stepped(1, 1.0)
    tracker.evaluation_forward()
    tracker.optimizer_stepped(1, 2.0)
    # then: the book is still told (a batch the thread counts meanwhile is never missed), and the batch taken in the
    # first step counted as training
    assert tracker.on_span_end == book.step_closed
    assert [(r.batches, r.eval_batches) for r in book.records()] == [(1, 0)]


def test_an_epoch_holds_the_loaders_length_over_the_batches_a_step_takes() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    data = torch.utils.data.TensorDataset(torch.zeros(40, 2))
    book = LoaderBook()
    assert book.epoch_steps(2) is None  # no batch taken yet
    # given a loader of 20 batches, 2 steps having taken 1 batch each, or 4 each (gradient accumulation)
    iterator = iter(DataLoader(data, batch_size=2))
    for _ in range(2):
        book.count_batch(iterator, next(iterator), wait_s=0.001)
    assert book.epoch_steps(2) == 20
    for _ in range(6):
        book.count_batch(iterator, next(iterator), wait_s=0.001)
    assert book.epoch_steps(2) == 5
    # and the batches a loader took ahead of the steps (the next step's, and one more where it looks ahead: accelerate's
    # under the Transformers Trainer) are no batches the steps took
    book = LoaderBook()
    iterator = iter(DataLoader(data, batch_size=2))
    for _ in range(3):
        book.count_batch(iterator, next(iterator), wait_s=0.001)
    assert book.epoch_steps(2) == 20


def test_an_evaluation_passs_batches_are_not_taken_for_an_epoch_of_training_steps() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    # given: minGPT's trainer: a training loader of 500 batches, whose step 1 also evaluates the model on two
    # loaders of its own, of 95 and 5 batches (its callback after the optimizer's step)
    book = LoaderBook()
    train = iter(DataLoader(TensorDataset(torch.zeros(1000, 2)), batch_size=2))
    book.count_batch(train, next(train), wait_s=0.001)
    book.step_closed(evaluated=False)
    for batches in (95, 5):
        evaluation = iter(DataLoader(TensorDataset(torch.zeros(batches * 100, 2)), batch_size=100))
        for batch in evaluation:
            book.count_batch(evaluation, batch, wait_s=0.001)
    book.count_batch(train, next(train), wait_s=0.001)
    book.step_closed(evaluated=True)
    # then: an epoch is the training loader's 500 steps, not the 95-batch loader's 2 (which placed every profiling
    # window one step each, and left the run without its memory window)
    assert book.epoch_steps(2) == 500


def test_a_stream_without_a_length_has_no_known_epoch() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset):
        def __iter__(self) -> Iterator[Any]:
            return iter(torch.zeros(8, 2))

    book = LoaderBook()
    iterator = iter(DataLoader(Stream(), batch_size=2))
    book.count_batch(iterator, next(iterator), wait_s=0.001)
    assert book.epoch_steps(1) is None
