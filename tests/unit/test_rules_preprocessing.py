"""The ``fp32-preprocessing`` rule on hand-built records: it fires when the steps wait for data, the dataset's
float16 lines take a notable share of an item, and float16 is measured slow here; it names the lines, with their
numbers, and says "not checked" without a data probe. ``cheaper-batches`` on a recorded run: where no worker count
shortens the step, it names the dataset's heaviest lines as the work to cut, or, where the loader's own collate
function builds most of each batch, that function's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import make_record
from gpuscope.diagnose.rules import evaluate
from gpuscope.diagnose.speed import what_if
from gpuscope.record import Breakdown, CollectorStatus, DataProbe, LineCost, Loader, Recommendation, RunRecord, Steps

RULE = "fp32-preprocessing"

LINES = (
    LineCost("dataset.py", 42, "Images.__getitem__", "img = img * 0.5 + noise", own_s=0.0091, float16=True),
    LineCost("dataset.py", 40, "Images.__getitem__", "img = decode(path)", own_s=0.0030, float16=False),
    LineCost("dataset.py", 47, "Images.__getitem__", "img = (img - MEAN) / STD", own_s=0.0032, float16=True),
    LineCost("dataset.py", 39, "Images.__getitem__", "img = self.images[index]", own_s=0.0001, float16=True),
    LineCost("dataset.py", 48, "Images.__getitem__", "return torch.from_numpy(img), label", own_s=0.0001,
             float16=True),
)


HALF_BATCH = ("float16[64, 3, 96, 96] cpu", "int64[64] cpu")


def fp16_run(data_wait: float = 0.62, float16_s: float = 0.0123, slowdown: float | None = 9.4,
             probe: bool = True, tensors: tuple[str, ...] = HALF_BATCH) -> RunRecord:
    """A CPU run whose loader feeds the model float16 images built by ``dataset.py``."""
    return make_record(
        steps=Steps(count=40, median_s=0.25, total=50, warmup=1, profiled=9, source="optimizer"),
        breakdown=Breakdown(data_wait=data_wait, forward=(1 - data_wait) / 2, backward=(1 - data_wait) / 2),
        loaders=(Loader(dataset="Images", batch_size=64, batches=50, wait_s=7.75, batch_tensors=tensors),),
        data_probe=DataProbe(dataset="Images", items=3, item_s=0.0158, float16_s=float16_s, lines=LINES,
                             numpy_float16_slowdown=slowdown, note="times measured under a line tracer")
        if probe else None,
        collectors={} if probe else {"data-probe": CollectorStatus("unavailable", "no map-style dataset was iterated", field="data_probe")},
    )


def recommendation(record: RunRecord) -> Recommendation | None:
    recommendations, _ = evaluate(record)
    return next((r for r in recommendations if r.id == RULE), None)


def test_float16_preprocessing_on_a_data_bound_run_is_named_with_its_numbers() -> None:
    # when
    found = recommendation(fp16_run())
    # then
    assert found is not None
    assert found.evidence == (
        "62% of each step waits for the next batch (median step 250.0 ms)",
        ("78% of fetching one Images item (12.3 ms of 15.8 ms, under a line tracer) is on lines producing float16 "
         "data: dataset.py:42 `img = img * 0.5 + noise` (9.1 ms), dataset.py:47 `img = (img - MEAN) / STD` (3.2 ms), "
         "dataset.py:39 `img = self.images[index]` (100 us)"),
        "NumPy float16 arithmetic ran 9.4x slower than float32 on this machine",
        "the Images loader's batches hold float16[64, 3, 96, 96] cpu",
    )
    assert found.fix == ("dataset.py:42, :47, :39: compute in float32 (`x = x.astype(np.float32)` first) and cast "
                         "to float16 at the end, or on the GPU")
    # data wait x float16 share x the share of float16 time float32 saves
    assert found.expected_gain == pytest.approx(0.62 * (0.0123 / 0.0158) * (1 - 1 / 9.4), abs=1e-3)


CASES = [
    ("data-bound, float16-heavy, float16 slow", fp16_run(), "fired"),
    ("float32 batches: the lines still compute in float16", fp16_run(tensors=("float32[64, 3, 96, 96] cpu",)), "fired"),
    ("slowdown not measured", fp16_run(slowdown=None), "fired"),
    ("little data wait", fp16_run(data_wait=0.02), "clear"),
    ("float16 a small share of the item (a final cast)", fp16_run(float16_s=0.0012), "clear"),
    ("float16 as fast as float32 here", fp16_run(slowdown=1.1), "clear"),
    ("no data probe", fp16_run(probe=False), "not-checked"),
    ("no loader", make_record(data_probe=fp16_run().data_probe), "not-checked"),
]


@pytest.mark.parametrize(("case", "record", "status"), CASES, ids=[c[0] for c in CASES])
def test_the_rule_fires_only_on_its_signal(case: str, record: RunRecord, status: str) -> None:
    _, checks = evaluate(record)
    assert checks[RULE].status == status
    assert (recommendation(record) is not None) == (status == "fired")


def test_without_a_measured_slowdown_the_gain_is_unknown() -> None:
    found = recommendation(fp16_run(slowdown=None))
    assert found is not None and found.expected_gain is None
    assert not any("slower than float32" in fact for fact in found.evidence)
    assert "`x = x.float()`" in found.fix


def test_float32_batches_are_not_called_float16() -> None:
    found = recommendation(fp16_run(tensors=("float32[64, 3, 96, 96] cpu",)))
    assert found is not None and not any("batches hold" in fact for fact in found.evidence)


def test_without_a_data_probe_the_rule_says_why_it_was_not_checked() -> None:
    _, checks = evaluate(fp16_run(probe=False))
    assert checks[RULE].reason == "the dataset was not probed (data-probe: no map-style dataset was iterated)"


def test_a_dataset_probed_a_batch_at_a_time_is_described_by_the_batch() -> None:
    # given: the dataset fetches whole batches of 64 (a BatchSampler passed as the loader's sampler)
    run = fp16_run()
    run = make_record(steps=run.steps, breakdown=run.breakdown, loaders=run.loaders,
                      data_probe=DataProbe(dataset="Images", items=3, item_s=0.0158, float16_s=0.0123, lines=LINES,
                                           numpy_float16_slowdown=9.4, batch_items=64))
    found = recommendation(run)
    assert found is not None
    assert found.evidence[1].startswith("78% of fetching one Images batch of 64 items (12.3 ms of 15.8 ms")


# -- cheaper-batches -----------------------------------------------------------------------------------------------
RECORDS = Path(__file__).parent.parent / "fixtures" / "records"


def tabular_run() -> RunRecord:
    """The recorded tabular run (tests/fixtures/records/README.md): 36% data wait on 2 cores, batches built in the
    main process, a per-row Python loop 98% of the time on the dataset's lines."""
    return RunRecord.from_json(json.loads((RECORDS / "tabular_batched.json").read_text()))


def test_where_no_worker_count_helps_the_slowest_dataset_line_is_named_with_its_share() -> None:
    # when
    recommendations, checks = evaluate(tabular_run())
    found = next((r for r in recommendations if r.id == "cheaper-batches"), None)
    # then: workers are not advised (they would take the cores the step computes on), less work per batch is
    assert checks["more-dataloader-workers"].status == "clear"
    assert found is not None and found.fix.startswith("tabular.py:23: do this work once, ahead of training")
    assert found.evidence[:2] == (
        "36% of each step waits for the next batch (median step 17.6 ms); the main process builds each batch",
        "no worker count shortens the step on this machine's 2 cores (measured by the loader probe): workers take "
        "the cores the step computes on")
    assert found.evidence[2].startswith("tabular.py:23 `feats = np.stack(")
    assert found.evidence[2].endswith(
        "(19.4 ms) takes 98% of fetching one Table batch of 512 items (of the 19.8 ms on the dataset's own lines, as "
        "the data probe timed them without its tracer's own work; 35.9 ms traced)")
    # and the gain is the wait less the line's share of it, an upper bound: 36% x 98% (vectorising the loop
    # measured 7-55% by pair, median 33%)
    assert found.expected_gain == pytest.approx(0.356, abs=0.001)


def test_the_what_if_of_a_loading_no_worker_count_hides_is_the_steps_compute() -> None:
    run = tabular_run()
    estimate = what_if(run, run.verdict)
    # then: the step less its data wait (36.3%), 11.2 ms
    assert estimate is not None and estimate.step_s == pytest.approx(run.steps.median_s * (1 - 0.363), rel=0.01)
    assert estimate.explanation.startswith("with batches cheap enough never to be waited for, the step's compute: "
                                           "workers do not hide the loading on this machine (with 2 DataLoader")
    assert estimate.explanation.endswith(": 24.5 ms)")


def test_where_workers_would_hide_the_loading_they_are_advised_instead() -> None:
    # given: the same run on 8 cores, where the workers leave the step its cores
    run = tabular_run()
    run = dataclasses.replace(run, meta=dataclasses.replace(run.meta, cpu_count=8))
    recommendations, checks = evaluate(run)
    assert checks["cheaper-batches"].status == "clear"
    assert recommendations[0].id == "more-dataloader-workers"


def test_a_heavy_float16_line_is_left_to_fp32_preprocessing() -> None:
    run = tabular_run()
    probe = run.data_probe
    assert probe is not None
    lines = tuple(dataclasses.replace(line, float16=line.line == 23) for line in probe.lines)
    run = dataclasses.replace(run, data_probe=dataclasses.replace(probe, lines=lines))
    assert evaluate(run)[1]["cheaper-batches"].status == "clear"


def test_with_workers_busy_on_every_core_the_step_is_shortened_at_most_by_the_wait() -> None:
    # given: the loader already had 2 workers on the 2 cores (no sign of them waiting on files), no probe curve
    run = tabular_run()
    run = dataclasses.replace(run, loaders=(dataclasses.replace(run.loaders[0], num_workers=2),), loader_probe=None)
    found = next(r for r in evaluate(run)[0] if r.id == "cheaper-batches")
    # then: the step falls by at most the data wait, 36.3%, under the line's 98%
    assert found.evidence[1] == "the Table loader's 2 workers already match the 2 cores"
    assert found.expected_gain == pytest.approx(0.363, abs=0.001)


def with_untraced_fetch(run: RunRecord, fetch_s: float, batch_items: int | None = 512) -> RunRecord:
    """``run`` whose data probe also timed a fetch untraced: ``fetch_s`` an item (a batch, with ``batch_items``)."""
    probe = run.data_probe
    assert probe is not None
    loader = dataclasses.replace(run.loaders[0], batch_size=512 if batch_items else 64)
    return dataclasses.replace(run, loaders=(loader,), data_probe=dataclasses.replace(
        probe, item_untraced_s=fetch_s, batch_items=batch_items))


def test_the_gain_counts_the_share_of_each_batchs_build_that_fetching_it_takes() -> None:
    # given: the tabular loop's batches fetched untraced in 5.2 ms, of the 6.58 ms the loop waited for each
    found = next(r for r in evaluate(with_untraced_fetch(tabular_run(), 0.0052))[0] if r.id == "cheaper-batches")
    assert found.evidence[3] == ("fetching its batch from the dataset, untraced, takes 5.20 ms of the 6.58 ms the loop "
                                 "waited for each batch (79%)")
    # then the gain is the wait x the line's share x that share: 36.3% x 98% x 79%
    assert found.expected_gain == pytest.approx(0.363 * 0.98 * 0.79, abs=0.003)


def test_an_item_whose_lines_are_all_light_is_not_blamed_on_them() -> None:
    # given: the batches' fetch is 79% of the wait, but the dataset's items were built ahead of training: its heaviest
    # line, an indexing, took 8.8 us of the 11.7 us on its lines (a GIN script's `feats, edges, label =
    # self.graphs[i]`): no work there to do once or vectorise
    run = with_untraced_fetch(tabular_run(), 0.0052)
    probe = run.data_probe
    assert probe is not None
    lines = (LineCost("gnn.py", 25, "Molecules.__getitem__", "feats, edges, label = self.graphs[i]", own_s=8.8e-6),
             LineCost("gnn.py", 28, "Molecules.__getitem__", "return x, edge_index, label", own_s=2.9e-6))
    run = dataclasses.replace(run, data_probe=dataclasses.replace(probe, lines=lines, lines_s=11.7e-6))
    # then no line is named
    assert evaluate(run)[1]["cheaper-batches"].status == "clear"


def test_batches_built_mostly_outside_the_dataset_are_not_blamed_on_its_lines() -> None:
    # given: a loader of 64 items a batch whose items take 10 us each untraced (a list indexed), 0.64 ms of the 6.58
    # ms each batch took: the rest is its collate_fn's (a padding loop in Python: the data probe traced only the
    # dataset's `return self.data[i], self.labels[i]`, "100% of fetching one item")
    run = with_untraced_fetch(tabular_run(), 1e-5, batch_items=None)
    assert evaluate(run)[1]["cheaper-batches"].status == "clear"


PADDING = (
    LineCost("collate.py", 30, "pad_collate", "row.append(tokens[t] if t < len(tokens) else 0)", own_s=0.0129),
    LineCost("collate.py", 29, "pad_collate", "for t in range(longest):", own_s=0.0076),
    LineCost("collate.py", 33, "pad_collate.<locals>.<listcomp>", "return torch.tensor(padded), lengths, ...",
             own_s=0.0031),
)
"""A padding collate_fn's lines, as the data probe traced one batch (the GRU script of issue 15's round)."""


def collated(run: RunRecord, collate_s: float) -> RunRecord:
    """``run`` whose batches of 64 items, each fetched in 10 us, the loop waited 6.58 ms for: its collate function
    collated one batch again in ``collate_s``, untraced, its lines as ``PADDING`` (24.5 ms traced in all)."""
    run = with_untraced_fetch(run, 1e-5, batch_items=None)
    probe = run.data_probe
    assert probe is not None
    return dataclasses.replace(run, data_probe=dataclasses.replace(
        probe, collate_s=collate_s, collate_lines=PADDING, collate_lines_s=0.0245))


def test_where_the_collate_function_builds_each_batch_its_lines_are_named() -> None:
    # given: the collate function took 4.2 ms of the 6.58 ms wait for each batch (64%)
    found = next((r for r in evaluate(collated(tabular_run(), 0.0042))[0] if r.id == "cheaper-batches"), None)
    # then: its two heaviest lines (84% of its lines' time), not the dataset's
    assert found is not None
    assert found.evidence[2] == ("fetching its 64 items from the dataset, untraced, takes 0.64 ms of the 6.58 ms the "
                                 "loop waited for each batch (10%)")
    assert found.evidence[3] == ("its collate function, pad_collate, collating one batch again after the run, "
                                 "untraced, took 4.20 ms (64% of that wait)")
    assert found.evidence[4].startswith("collate.py:30 `row.append(tokens[t] if t < len(tokens) else 0)` (12.9 ms), "
                                        "collate.py:29 `for t in range(longest):` (7.6 ms) take 84% of it")
    assert found.fix.startswith("collate.py:30, :29: build the batch with less Python in pad_collate: vectorise it")
    # and the gain, an upper bound (the lines' work gone): the wait x the function's share x its lines' share
    assert found.expected_gain == pytest.approx(0.363 * (0.0042 / 0.00658) * (0.0205 / 0.0245), abs=0.003)


def test_where_the_collate_function_takes_longer_than_the_items_its_lines_are_named_not_the_datasets() -> None:
    # given: fetching a batch's 64 items took 3.84 ms untraced (58% of the 6.58 ms wait), collating them 4.2 ms (a
    # graph batcher's loop; the two, each timed once after the run, add up to more than the wait)
    run = collated(tabular_run(), 0.0042)
    probe = run.data_probe
    assert probe is not None
    run = dataclasses.replace(run, data_probe=dataclasses.replace(probe, item_untraced_s=6e-5))
    # then: the collate function's lines are named, not the dataset's, the heavier of the two
    found = next((r for r in evaluate(run)[0] if r.id == "cheaper-batches"), None)
    assert found is not None
    assert found.evidence[2].startswith("fetching its 64 items from the dataset, untraced, takes 3.84 ms")
    assert found.fix.startswith("collate.py:30, :29: build the batch with less Python in pad_collate")


def test_a_collate_function_that_takes_little_of_the_wait_is_not_named() -> None:
    # 2 ms of the 6.58 ms wait: most of the batch's build is neither the dataset's nor the collate function's
    assert evaluate(collated(tabular_run(), 0.002))[1]["cheaper-batches"].status == "clear"


def small_items_run() -> RunRecord:
    """The recorded run of tests/fixtures/scripts/small_items.py (tests/fixtures/records/README.md): a TensorDataset
    of 2,048 rows of 16 floats, batches of 512 fetched item by item in the main process, workers timed slower."""
    return RunRecord.from_json(json.loads((RECORDS / "small_items.json").read_text()))


def cheaper_batches(run: RunRecord) -> Recommendation | None:
    return next((r for r in evaluate(run)[0] if r.id == "cheaper-batches"), None)


def test_light_items_fetched_one_by_one_where_workers_are_slower_are_sliced_a_batch_at_a_time() -> None:
    # given: 83% of the 1.32 ms step waits for data; the loader probe timed workers slower than the main process;
    # the data probe built one batch again item by item in 1.02 ms, and sliced it from its tensors in 0.013 ms
    run = small_items_run()
    probe = run.data_probe
    assert probe is not None and probe.batch_built_s and probe.batch_sliced_s
    # when
    found = cheaper_batches(run)
    # then: the loader's line is named, with the slicing that replaces it
    assert found is not None
    assert found.fix.startswith("small_items.py:58: slice each batch from the dataset's tensors instead of fetching "
                                "its items one by one through the DataLoader: each epoch, `for index in "
                                "torch.randperm(len(dataset)).split(512):`, then `batch = [t[index] for t in "
                                "dataset.tensors]`")
    assert found.evidence[1] == ("workers deliver batches slower here: the loader probe timed 1 worker at 302 "
                                 "batches/s, 2 at 363, against 713 a second built in the main process during the run")
    assert found.evidence[2] == ("building a batch as the loader does, `dataset[i]` for each of its 512 items, then "
                                 "default_collate, took 1.02 ms untraced after the run (77% of the median step)")
    assert found.evidence[3].startswith("sliced from its tensors instead, indexed by a tensor of its 512 indices")
    # and the gain: the loader's whole wait goes but the slicing, 82.8% - 0.013 / 1.32 ms (measured without
    # gpuscope: 88.7% by the median of four alternating pairs, docs/diagnosis.md)
    wait, median = run.breakdown.data_wait, run.steps.median_s
    assert found.expected_gain == pytest.approx(wait - probe.batch_sliced_s / median, abs=1e-3)


def test_a_line_of_light_items_timed_heavy_by_a_loaded_machine_is_not_taken_for_work_to_do_ahead() -> None:
    # given: CI's run of the list dataset beside two other test runs: its one line, `return self.items[index]`, timed
    # at 23.7 us (over the 20 us a named line needs), while the batch of 512 built untraced in 0.41 ms, 0.8 us an item
    line = LineCost(file="small_items.py", line=35, function="Listed.__getitem__", code="return self.items[index]",
                    own_s=2.371e-05)
    run = with_batches(small_items_run(), dataset="Listed", lines=(line,), lines_s=2.371e-05, item_s=1.273e-04,
                       batch_built_s=4.099e-04, batch_sliced_s=4.345e-05)
    # then: the items are light as timed, and the advice is the slicing at the loader's line, not the line's work
    # done ahead of training
    found = cheaper_batches(run)
    assert found is not None and found.fix.startswith("small_items.py:58: slice each batch from tensors instead of "
                                                      "fetching its items one by one through the DataLoader")


def test_keeping_the_dataloader_the_one_call_fetch_is_offered_with_its_own_gain() -> None:
    # given: the batch fetched in one call, dataset[indices], in 0.118 ms of the 1.02 ms item by item
    run = small_items_run()
    probe = run.data_probe
    assert probe is not None and probe.batch_built_s and probe.batch_fetched_s
    found = cheaper_batches(run)
    assert found is not None
    # then: min(data wait, the build's share of the step) x the share of the build the call saves, 77% x 88%
    one_call = min(run.breakdown.data_wait, probe.batch_built_s / run.steps.median_s) * (
        1 - probe.batch_fetched_s / probe.batch_built_s)
    assert (f"keeping the DataLoader, a BatchSampler saves less, about {one_call:.0%} of the step: `DataLoader("
            "dataset, sampler=BatchSampler(RandomSampler(dataset), batch_size=512, drop_last=False), batch_size=None)`"
            in found.fix)


def with_batches(run: RunRecord, **fields: Any) -> RunRecord:
    """``run`` whose data probe built its batch again with these figures (``batch_built_s``...)."""
    probe = run.data_probe
    assert probe is not None
    return dataclasses.replace(run, data_probe=dataclasses.replace(probe, **fields))


def test_items_that_are_more_than_their_indexing_are_not_sliced_but_fetched_in_one_call() -> None:
    # given: a dataset of the user's own whose batches were built item by item in 5.5 ms after the run, 10.7 us an
    # item: more than an indexing (a decode, a transform), work that slicing stacked tensors would drop
    run = with_batches(small_items_run(), batch_built_s=0.0055, dataset="Records")
    found = cheaper_batches(run)
    # then: one dataset[indices] call through the loader, its gain min(82.8%, 5.5 / 1.32 ms) x (1 - 0.118 / 5.5):
    # the wait at most, however long the build timed again
    assert found is not None and "keeping the DataLoader" not in found.fix
    assert found.fix == ("small_items.py:58: fetch each batch in one call: `DataLoader(dataset, sampler=BatchSampler("
                         "RandomSampler(dataset), batch_size=512, drop_last=False), batch_size=None)`, each fetch then "
                         "one `dataset[indices]`")
    assert found.expected_gain == pytest.approx(run.breakdown.data_wait * (1 - 0.000118 / 0.0055), abs=1e-3)


def test_a_tensor_datasets_items_are_their_indexing_however_long_a_busy_machine_took_to_build_them() -> None:
    # given: the TensorDataset's batch built again in 5.5 ms, 10.7 us an item (a busy machine: CI at 31ce129 timed it
    # so, beside two other test runs)
    found = cheaper_batches(with_batches(small_items_run(), batch_built_s=0.0055))
    # then: its items are nothing but their indexing: sliced from its tensors all the same
    assert found is not None
    assert found.fix.startswith("small_items.py:58: slice each batch from the dataset's tensors instead of fetching")


def test_a_dataset_of_the_users_own_is_sliced_from_the_tensors_its_getitem_reads() -> None:
    # given: a Dataset keeping its items in a list, which takes one index only (no one-call figure)
    line = LineCost("small_items.py", 35, "Listed.__getitem__", "return self.items[index]", own_s=3.7e-6)
    run = with_batches(small_items_run(), dataset="Listed", lines=(line,), lines_s=3.7e-6, batch_fetched_s=None)
    found = cheaper_batches(run)
    # then its __getitem__ line is named, with the tensors to stack once
    assert found is not None
    assert "then index by `index` the tensors that small_items.py:35 `return self.items[index]` reads an item from " \
           "(stacked once, in __init__, where the items are kept apart)" in found.fix
    assert found.evidence[-1] == ("Listed.__getitem__ runs once an item: small_items.py:35 `return self.items[index]` "
                                  "(3.7 us traced)")


def test_a_batch_that_one_call_builds_little_faster_is_left_alone() -> None:
    # the one call and the slicing each save under half of the item-by-item build
    run = with_batches(small_items_run(), batch_built_s=0.0002, batch_fetched_s=0.00015, batch_sliced_s=0.00011)
    assert evaluate(run)[1]["cheaper-batches"].status == "clear"


def test_a_record_without_the_batch_builds_is_checked_as_before() -> None:
    run = with_batches(small_items_run(), batch_built_s=None, batch_fetched_s=None, batch_sliced_s=None)
    assert evaluate(run)[1]["cheaper-batches"].status == "clear"


def with_two_workers(run: RunRecord, batches_per_s: float, handover_s: float, cores: int = 2) -> RunRecord:
    """``run`` whose loader probe timed 2 workers at ``batches_per_s``, handing each batch over in ``handover_s``."""
    probe = run.loader_probe
    assert probe is not None
    rates = tuple(dataclasses.replace(r, batches_per_s=batches_per_s, handover_s=handover_s, receive_s=handover_s)
                  if r.num_workers == 2 else r for r in probe.rates)
    return dataclasses.replace(run, loader_probe=dataclasses.replace(probe, rates=rates),
                               meta=dataclasses.replace(run.meta, cpu_count=cores))


def test_workers_that_would_shorten_the_step_less_than_slicing_leave_the_advice_with_their_step() -> None:
    # given: 2 workers timed at 1,500 batches/s, a step of 1/1500 s = 0.67 ms with them, against 0.24 ms sliced
    run = with_two_workers(small_items_run(), 1500, 2e-5)
    found = cheaper_batches(run)
    # then both are advised, slicing first, which says what the workers would give
    assert found is not None
    assert found.evidence[1] == ("workers are predicted to shorten the step less, to 0.67 ms at best (from the loader "
                                 "probe and the run's batches)")
    assert evaluate(run)[0][0].id == "cheaper-batches"


def test_workers_that_would_hide_the_loading_as_well_leave_the_rule_clear() -> None:
    # given: 8 cores, 2 workers at 20,000 batches/s handing batches over for free: the step would be its compute
    run = with_two_workers(small_items_run(), 20000, 0.0, cores=8)
    # then workers are advised, not slicing
    recommendations, checks = evaluate(run)
    assert checks["cheaper-batches"].status == "clear"
    assert recommendations[0].id == "more-dataloader-workers"
