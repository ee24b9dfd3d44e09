"""cProfile in forked DataLoader workers: a worker profiles its first batches through a wrapper around the
DataLoader's fetch, which must not show in the traceback of a dataset's error (the "Original Traceback" the user's
DataLoader prints comes from the worker's formatted traceback)."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import pytest
from torch.utils.data import Dataset
from torch.utils.data._utils import fetch

from gpuscope.collect.workers import WorkerProfiler

GPUSCOPE_DIR = str(Path(__file__).resolve().parents[2] / "gpuscope")


class Broken(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        raise KeyError(f"no item {index}")  # the user's bug


def test_a_dataset_error_in_a_profiled_worker_carries_no_gpuscope_frame(tmp_path: Path) -> None:
    # given: the fetch wrapper, as a forked worker runs it (its pid is not the main process's)
    profiler = WorkerProfiler(tmp_path)
    restore = profiler.install()
    profiler._parent = os.getpid() + 1
    try:
        fetcher = fetch._MapDatasetFetcher(Broken(), auto_collation=True, collate_fn=list, drop_last=False)
        # when
        with pytest.raises(KeyError) as raised:
            fetcher.fetch([0, 1])
    finally:
        restore()
    # then: the traceback runs from the fetch to the dataset's line, as under python
    formatted = "".join(traceback.format_exception(raised.value))
    assert "no item 0" in formatted and "__getitem__" in formatted
    assert GPUSCOPE_DIR not in formatted, formatted
