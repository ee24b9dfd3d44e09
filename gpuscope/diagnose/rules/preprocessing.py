"""Rules about the work that builds each item: what the dataset's own lines compute, and in what precision."""

from __future__ import annotations

import math
import re

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import DATA_WAIT, batches_per_step, slowest_loader, training_batches, training_wait_s
from gpuscope.diagnose.rules.base import Finding, Refused, rule
from gpuscope.diagnose.speed import loader_estimate, loader_plan
from gpuscope.diagnose.waiting_workers import waiting_workers
from gpuscope.diagnose.words import duration_text
from gpuscope.record import DataProbe, LineCost, Loader, RunRecord

SHOWN_LINES = 3
"""float16 lines named in the evidence, heaviest first."""
_LOADER_DATASET = re.compile(r"DataLoader\(\s*([A-Za-z_][\w.]*)\s*[,)]")
"""The dataset a DataLoader's line passes first (``DataLoader(train_set, ...)``), to write the fix with its name."""


@rule(id="fp32-preprocessing",
      title="Keep the CPU preprocessing in float32",
      fix="compute in float32 (`x = x.astype(np.float32)` first) and cast to float16 at the end, or on the GPU",
      needs=("loaders", "data_probe"),
      resolved_by=(DATA_WAIT,),
      trial=Refused("it is a change to your dataset's code"))
def fp32_preprocessing(run: RunRecord) -> Finding | None:
    """Signal: steps wait for data for a notable share of their time, and a notable share of building an item
    (measured by the data probe, line by line) is on lines of the user's dataset that produce float16 arrays or
    tensors, on a machine where NumPy's float16 arithmetic is measured markedly slower than float32.
    Why it matters: most CPUs have no float16 arithmetic; NumPy converts every element to float32 and back
    around each operation, so float16 preprocessing is several times slower than the same math in float32
    (keeping the preprocessing in fp32 took a ResNet-50 training run from 5.07 to 7.69 it/s).
    Fix: convert to float32 first, do the math, and cast to float16 at the end (or on the GPU). Expected gain:
    data wait x float16 share of the item x (1 - 1/slowdown); unknown when the slowdown was not measured."""
    probe: DataProbe = run.data_probe  # type: ignore[assignment]
    share = run.breakdown.data_wait
    if share < th.DATA_WAIT_NOTABLE or probe.item_s <= 0:
        return None
    float16_share = min(1.0, probe.float16_s / probe.item_s)
    slowdown = probe.numpy_float16_slowdown
    if float16_share < th.FLOAT16_SHARE_NOTABLE or (slowdown is not None and slowdown < th.FLOAT16_SLOWDOWN_NOTABLE):
        return None
    heavy = [line for line in probe.lines if line.float16][:SHOWN_LINES]
    evidence = [
        _waits_fact(run),
        f"{float16_share:.0%} of fetching one {probe.dataset} {_fetched(probe)} ({duration_text(probe.float16_s)} of "
        f"{duration_text(probe.item_s)}, under a line tracer) is on lines producing float16 data"
        + (": " + ", ".join(f"{_where(line)} `{line.code}` ({duration_text(line.own_s)})" for line in heavy)
           if heavy else ""),
    ]
    if slowdown is not None:
        evidence.append(f"NumPy float16 arithmetic ran {slowdown:.1f}x slower than float32 on this machine")
    loader = _loader_of(run, probe.dataset)
    half = [t for t in loader.batch_tensors if t.startswith("float16[")]
    if half:
        evidence.append(f"the {loader.dataset} loader's batches hold {', '.join(half)}")
    gain = share * float16_share * (1 - 1 / slowdown) if slowdown is not None else None
    return Finding(gain, tuple(evidence), fix=_fix(heavy, numpy=slowdown is not None))


@rule(id="cheaper-batches",
      title="Build each batch with less work: more workers cannot hide the loading here",
      fix="do the dataset's slowest lines' work once, ahead of training (in __init__, or cached to disk), or "
          "vectorise it over the batch",
      needs=("loaders", "batch_build"),
      resolved_by=(DATA_WAIT,),
      trial=Refused("it is a change to your dataset's or collate function's code"))
def cheaper_batches(run: RunRecord) -> Finding | None:
    """Signal: steps wait for data a notable share of their time; no worker count would shorten the step by
    ``WORKERS_HELP`` on this machine (the loader probe's plan, else the estimate from the run's batch time, or,
    with workers as many as the cores, the estimate from their CPU time: ``_workers_help``); and a few of the
    dataset's own lines take ``CHEAPER_LINES_SHARE`` of fetching an item as the data probe timed them (each
    ``CHEAPER_LINE_SHARE`` and ``CHEAPER_LINE_MIN_S`` at least; float16 lines left to ``fp32-preprocessing``): of
    the time on all its lines, the tracer's own work left out (``lines_s``), which a line of a Python loop inflates
    several times; and, with no workers, fetching a batch's items (untraced) is ``CHEAPER_ITEMS_SHARE`` of the
    loop's wait for it at least (``_items_share``: else the batch is built mostly outside the dataset, by its
    collate_fn: then, where that function is the user's own, its lines take the dataset's place,
    ``_collate_finding``, as they do where collating a batch took longer than fetching its items, or where the
    dataset's lines are too light to name); or the user's own sampler takes that share of the wait drawing each
    batch's indices (``_sampler_finding``: no worker count hides it); or, where neither names a line, the items are
    light and many: a batch built again item by item takes ``CHEAPER_ONE_CALL_SAVES`` more than the same batch
    sliced from its tensors or fetched in one call (``_one_call_finding``; there, workers that would shorten the step
    keep the rule clear only where they are predicted to shorten it as much).
    Why it matters: where workers would take the cores the step computes on, or already have them all, the wait
    falls only with the work per batch: a per-row Python loop vectorised over the batch, a deterministic transform
    or decode done once ahead of training, a call and a collation per item of a few floats made one per batch.
    Fix: those lines' work once, ahead of training, or vectorised; light items sliced a batch at a time.
    Gain, an upper bound (the lines' work gone altogether, as precomputing it makes it): built in the main process,
    the wait falls by the lines' share (of the items', where timed untraced), data wait x share; by workers, the
    step by at most that share, min(data wait, share). On the tabular script (tests/fixtures/records): promised
    35.6% (the loop 19.4 of the 19.8 ms on the dataset's lines, 36% data wait), measured 7-55% by pair (median 33%)
    with the loop vectorised. Light items: see ``_one_call_finding`` (docs/diagnosis.md has the figures)."""
    probe, share, median, loader = run.data_probe, run.breakdown.data_wait, run.steps.median_s, slowest_loader(run)
    if loader is not None and median and share >= th.DATA_WAIT_NOTABLE and (found := _sampler_finding(run, loader)):
        return found
    if probe is None or loader is None or not median or share < th.DATA_WAIT_NOTABLE or probe.item_s <= 0:
        return None
    if _workers_help(run, loader, median):  # only light items built in one go, measured, may shorten it more
        return _one_call_finding(run, loader, probe)
    if not loader.num_workers and probe.batch_built_s and loader.batch_size \
            and probe.batch_built_s / loader.batch_size <= th.CHEAPER_ONE_CALL_ITEM_S:
        # items built untraced in that long each hold no line of CHEAPER_LINE_MIN_S: a line timed so is the probe's
        # noise (a list's `return self.items[index]` at 23.7 us, its batch built at 0.8 us an item, three runs beside)
        return _one_call_finding(run, loader, probe)
    items = _items_share(loader, probe)
    whole_s = probe.lines_s or probe.item_s  # untraced, about (older records: the traced time)
    heavy = [line for line in probe.lines if not line.float16
             and line.own_s >= max(th.CHEAPER_LINE_SHARE * whole_s, th.CHEAPER_LINE_MIN_S)][:th.CHEAPER_LINES_SHOWN]
    lines_share = min(1.0, sum(line.own_s for line in heavy) / whole_s)
    # the batch is built mostly by its collate_fn, or more by it than by the dataset, or the dataset's lines are light
    if items is not None and (items[0] < th.CHEAPER_ITEMS_SHARE or (probe.collate_s or 0) > _fetch_s(loader, probe)
                              or lines_share < th.CHEAPER_LINES_SHARE):
        return _collate_finding(run, loader, probe, items[1]) or _one_call_finding(run, loader, probe)
    if lines_share < th.CHEAPER_LINES_SHARE:
        return _one_call_finding(run, loader, probe)
    built = "the main process builds each batch" if not loader.num_workers else \
        f"its {loader.num_workers} workers build the batches"
    evidence = (
        f"{_waits_fact(run)}; {built}",
        _no_workers_fact(run, loader),
        ", ".join(f"{_where(line)} `{line.code}` ({duration_text(line.own_s)})" for line in heavy)
        + f" take{'s' if len(heavy) == 1 else ''} {lines_share:.0%} of fetching one {probe.dataset} {_fetched(probe)}"
        + (f" (of the {duration_text(whole_s)} on the dataset's own lines, as the data probe timed them without its "
           f"tracer's own work; {duration_text(probe.item_s)} traced)" if probe.lines_s else
           f" ({duration_text(probe.item_s)} under a line tracer)"),
    ) + ((items[1],) if items is not None else ())
    lines_share *= items[0] if items is not None else 1.0
    gain = share * lines_share if not loader.num_workers else min(share, lines_share)
    fix = f"{_places(heavy)}: do this work once, ahead of training (in __init__, or cached to disk), or vectorise it " \
          "over the batch"
    return Finding(gain, evidence, fix=fix)


def _sampler_finding(run: RunRecord, loader: Loader) -> Finding | None:
    """``cheaper-batches`` where the user's own sampler, drawing each batch's indices in the main process (the
    loader probe timed it again), takes ``CHEAPER_ITEMS_SHARE`` of the loop's wait for a batch or more, and no worker
    count shortens the step (the loader plan counts the sampler's time: workers do not run it). Gain, an upper
    bound: data wait x the sampler's share of it."""
    probe, build_s = run.loader_probe, _wait_per_batch(loader)
    if probe is None or not probe.sampler_s or build_s is None:
        return None
    drawn = min(1.0, probe.sampler_s / build_s)
    if drawn < th.CHEAPER_ITEMS_SHARE or _workers_help(run, loader, run.steps.median_s):
        return None
    name, _, where = probe.sampler.partition(" (")
    evidence = (
        _waits_fact(run),
        f"the loader's sampler, {probe.sampler}, takes {probe.sampler_s * 1e3:.1f} ms to draw each batch's indices "
        f"(timed again after the run): {drawn:.0%} of the {build_s * 1e3:.1f} ms the loop waited for each batch",
        "no worker count shortens the step (the loader probe's plan): the main process draws every batch's indices "
        "itself, however many workers build the batches",
    )
    fix = (f"{where.rstrip(')')}: draw each batch's indices with less work in {name}.__iter__: compute what every "
           "draw shares (class counts, weights) once, in __init__, or draw the epoch's indices at once "
           "(torch.multinomial; torch.utils.data.WeightedRandomSampler)")
    return Finding(run.breakdown.data_wait * drawn, evidence, fix=fix)


def _one_call_finding(run: RunRecord, loader: Loader, probe: DataProbe) -> Finding | None:
    """``cheaper-batches`` where a loader without workers builds each batch from one ``dataset[i]`` call an item and
    torch's default_collate, and the data probe, building one batch again, got it in ``CHEAPER_ONE_CALL_SAVES`` less
    time or better: sliced from its tensors without a loader (for items of ``CHEAPER_ONE_CALL_ITEM_S`` at most,
    nothing but their indexing), else through the loader in one call for all its indices. Gain, sliced: the data
    wait less the slicing's share of the step (the loader's whole wait goes); in one call: min(data wait, the
    build's share of the step) x the share of the build the call saves. Clear where workers are predicted to give a
    step as short (or nothing predicts theirs)."""
    built_s, size, median = probe.batch_built_s, loader.batch_size, run.steps.median_s
    if loader.num_workers or not built_s or not size or not median:
        return None
    per, wait = batches_per_step(training_batches(loader), run.steps.total), run.breakdown.data_wait
    fetched_s, sliced_s = probe.batch_fetched_s, probe.batch_sliced_s
    one_call = (min(wait, per * built_s / median) * (1 - fetched_s / built_s)
                if fetched_s is not None and fetched_s <= (1 - th.CHEAPER_ONE_CALL_SAVES) * built_s else None)
    # the items are their indexing, nothing lost sliced: a TensorDataset's by construction (however long a busy
    # machine took to build them again), another's where they took CHEAPER_ONE_CALL_ITEM_S or less
    light = probe.dataset == "TensorDataset" or built_s / size <= th.CHEAPER_ONE_CALL_ITEM_S
    sliced = (max(0.0, wait - per * sliced_s / median)
              if sliced_s is not None and light and sliced_s <= (1 - th.CHEAPER_ONE_CALL_SAVES) * built_s else None)
    gain = sliced if sliced is not None else one_call
    workers_s = _workers_step_s(run, loader)
    if gain is None or workers_s is None or workers_s <= median * (1 - gain):
        return None  # nothing predicts what workers would do, or they would do as well
    evidence = [
        f"{_waits_fact(run)}; the main process builds each batch",
        f"workers are predicted to shorten the step less, to {workers_s * 1e3:.2f} ms at best (from the loader "
        "probe and the run's batches)" if workers_s < median * (1 - th.WORKERS_HELP)
        else _rates_fact(run) or _no_workers_fact(run, loader),
        f"building a batch as the loader does, `dataset[i]` for each of its {size} items, then default_collate, took "
        f"{built_s * 1e3:.2f} ms untraced after the run ({per * built_s / median:.0%} of the median step)",
    ]
    if sliced is not None:
        evidence.append(f"sliced from its tensors instead, indexed by a tensor of its {size} indices (with its share "
                        f"of an epoch's torch.randperm), the same batch took {sliced_s * 1e3:.3f} ms: all a step would "
                        f"wait of its {wait * median * 1e3:.2f} ms without the DataLoader")  # type: ignore[operator]
    if fetched_s is not None:
        evidence.append(f"fetched through the DataLoader in one call, `dataset[indices]` with a list of its {size} "
                        f"indices, it took {fetched_s * 1e3:.2f} ms")
    getitem = [line for line in probe.lines if line.function.endswith("__getitem__")][:2]
    if getitem:
        evidence.append(f"{probe.dataset}.__getitem__ runs once an item: " + ", ".join(
            f"{_where(line)} `{line.code}` ({line.own_s * 1e6:.1f} us traced)" for line in getitem))
    return Finding(gain, tuple(evidence), fix=_one_call_fix(loader, probe, getitem, sliced is not None, one_call))


def _one_call_fix(loader: Loader, probe: DataProbe, getitem: list[LineCost], sliced: bool,
                  one_call: float | None) -> str:
    """The loader's line and the change: each batch sliced from the tensors (the dataset's own, or its items stacked
    once), or fetched through the loader in one call, with that option's gain where it is the second."""
    site = loader.created_at
    name = match.group(1) if site is not None and (match := _LOADER_DATASET.search(site.code)) else "dataset"
    where = f"{_where(site)}: " if site is not None and not loader.created_by else ""
    batch_sampler = (f"`DataLoader({name}, sampler=BatchSampler(RandomSampler({name}), batch_size={loader.batch_size}, "
                     "drop_last=False), batch_size=None)`, each fetch then one `dataset[indices]`")
    if not sliced:
        return f"{where}fetch each batch in one call: {batch_sampler}"
    epoch = f"each epoch, `for index in torch.randperm(len({name})).split({loader.batch_size}):`, then"
    if probe.dataset == "TensorDataset":
        fix = (f"{where}slice each batch from the dataset's tensors instead of fetching its items one by one through "
               f"the DataLoader: {epoch} `batch = [t[index] for t in {name}.tensors]`")
    else:
        reads = f" that {_where(getitem[0])} `{getitem[0].code}` reads an item from" if getitem else ""
        fix = (f"{where}slice each batch from tensors instead of fetching its items one by one through the "
               f"DataLoader: {epoch} index by `index` the tensors{reads} (stacked once, in __init__, where the items "
               "are kept apart)")
    fix += " (torch.arange for a loader that does not shuffle)"
    if one_call is not None:
        fix += f"; keeping the DataLoader, a BatchSampler saves less, about {one_call:.0%} of the step: {batch_sampler}"
    return fix


def _rates_fact(run: RunRecord) -> str | None:
    """The loader probe's rates in a sentence, where every worker count it timed in full delivered batches slower
    than the main process built them during the run; None otherwise."""
    probe = run.loader_probe
    rates = [r for r in probe.rates if not r.pin_memory and r.batches_per_s and (not r.num_workers or not r.note)
             ] if probe is not None else []  # a worker count's note: its rate estimated, or a lower bound
    own = next((r for r in rates if r.num_workers == 0), None)
    workers = [r for r in rates if r.num_workers]
    if own is None or not workers or max(r.batches_per_s or 0.0 for r in workers) > (own.batches_per_s or 0.0):
        return None
    timed = ", ".join(f"{r.num_workers} at {r.batches_per_s:.0f}" if k else
                      f"{r.num_workers} worker{'s' if r.num_workers > 1 else ''} at {r.batches_per_s:.0f} batches/s"
                      for k, r in enumerate(workers))
    return (f"workers deliver batches slower here: the loader probe timed {timed}, against "
            f"{own.batches_per_s:.0f} a second built in the main process during the run")


def _collate_finding(run: RunRecord, loader: Loader, probe: DataProbe, items_fact: str) -> Finding | None:
    """``cheaper-batches`` where the loop's wait for a batch is mostly its collate function's (the user's own): its
    heaviest lines as the data probe traced one batch, where that function takes ``CHEAPER_ITEMS_SHARE`` of the wait
    at least (timed untraced). Gain: data wait x the function's share of the wait x its lines' share."""
    lines_s, build_s = probe.collate_lines_s, _wait_per_batch(loader)
    if not probe.collate_s or not lines_s or build_s is None:
        return None
    heavy = [line for line in probe.collate_lines if line.own_s >= th.CHEAPER_LINE_SHARE * lines_s]
    heavy = heavy[:th.CHEAPER_LINES_SHOWN]
    lines_share = min(1.0, sum(line.own_s for line in heavy) / lines_s)
    collate_share = min(1.0, probe.collate_s / build_s)
    if lines_share < th.CHEAPER_LINES_SHARE or collate_share < th.CHEAPER_ITEMS_SHARE:
        return None
    name = heavy[0].function.split(".")[0]
    evidence = (
        f"{_waits_fact(run)}; the main process builds each batch",
        _no_workers_fact(run, loader),
        items_fact,
        f"its collate function, {name}, collating one batch again after the run, untraced, took "
        f"{probe.collate_s * 1e3:.2f} ms ({collate_share:.0%} of that wait)",
        ", ".join(f"{_where(line)} `{line.code}` ({duration_text(line.own_s)})" for line in heavy)
        + f" take{'s' if len(heavy) == 1 else ''} {lines_share:.0%} of it (of the {duration_text(lines_s)} on its "
        "lines, as the data probe timed them without its tracer's own work)",
    )
    fix = f"{_places(heavy)}: build the batch with less Python in {name}: vectorise it over the batch (" \
          "torch.nn.utils.rnn.pad_sequence pads a batch of sequences in one call), or do the work once, ahead of " \
          "training"
    return Finding(run.breakdown.data_wait * collate_share * lines_share, evidence, fix=fix)


def _items_share(loader: Loader, probe: DataProbe) -> tuple[float, str] | None:
    """With no workers, the share of building a batch (the training steps' wait for it) that fetching its items
    from the dataset takes, untraced, with the fact; None where a figure is missing. The rest is the loader's own
    work: its collate_fn (a padding loop in Python), its sampler."""
    fetch_s, build_s = _fetch_s(loader, probe), _wait_per_batch(loader)
    if loader.num_workers or not fetch_s or build_s is None:
        return None
    share = min(1.0, fetch_s / build_s)
    what = "its batch" if probe.batch_items else f"its {loader.batch_size} items"
    return share, (f"fetching {what} from the dataset, untraced, takes {fetch_s * 1e3:.2f} ms of the "
                   f"{build_s * 1e3:.2f} ms the loop waited for each batch ({share:.0%})")


def _fetch_s(loader: Loader, probe: DataProbe) -> float:
    """Fetching a batch's items from the dataset, untraced, as the data probe timed it (0.0 where not timed)."""
    return (probe.item_untraced_s or 0.0) * (1 if probe.batch_items else (loader.batch_size or 0))


def _wait_per_batch(loader: Loader) -> float | None:
    """The training loop's mean wait for each of the loader's batches (evaluation passes left out); None without
    one."""
    batches, wait_s = loader.batches - loader.eval_batches, loader.wait_s - loader.eval_wait_s
    return wait_s / batches if batches > 0 and wait_s > 0 else None


def _waits_fact(run: RunRecord) -> str:
    """The steps' wait for data, in a sentence."""
    return (f"{run.breakdown.data_wait:.0%} of each step waits for the next batch (median step "
            f"{run.steps.median_s * 1e3:.1f} ms)")


def _workers_help(run: RunRecord, loader: Loader, median: float) -> bool:
    """Whether some worker count is predicted to shorten the step by ``WORKERS_HELP`` on this machine (True where
    nothing predicts the step: the worker rules then speak)."""
    step_s = _workers_step_s(run, loader)
    return step_s is None or step_s < median * (1 - th.WORKERS_HELP)


def _workers_step_s(run: RunRecord, loader: Loader) -> float | None:
    """The shortest step a worker count is predicted to give on this machine (the loader probe's plan, else the
    estimate from the run's batches; infinite where as many workers as the cores are busy already); None where
    nothing predicts it."""
    if loader.num_workers >= (run.meta.cpu_count or 1):
        waiting = waiting_workers(run)
        return waiting.step_s if waiting is not None and waiting.step_s is not None else math.inf
    if (plan := loader_plan(run)) is not None:
        return plan.step_s
    return estimate.step_s if (estimate := loader_estimate(run)) is not None else None


def _no_workers_fact(run: RunRecord, loader: Loader) -> str:
    """Why workers do not hide the loading here, in a sentence."""
    cores = run.meta.cpu_count or 1
    if loader.num_workers >= cores:
        return f"the {loader.dataset} loader's {loader.num_workers} workers already match the {cores} cores"
    measured = "measured by the loader probe" if run.loader_probe is not None else "estimated from the run's batches"
    return (f"no worker count shortens the step on this machine's {cores} cores ({measured}): workers take the cores "
            "the step computes on")


def _fetched(probe: DataProbe) -> str:
    """What one fetch of the probed dataset gave: an item, or a batch where the dataset fetches whole batches."""
    return f"batch of {probe.batch_items} items" if probe.batch_items else "item"


def _where(line: LineCost) -> str:
    return f"{line.file}:{line.line}"


def _loader_of(run: RunRecord, dataset: str) -> Loader:
    """The loader over the probed dataset (the one waited on longest, if several share its class)."""
    matching = [loader for loader in run.loaders if loader.dataset == dataset] or list(run.loaders)
    return max(matching, key=training_wait_s)


def _fix(lines: list[LineCost], numpy: bool) -> str:
    """The rule's fix with the lines to change in front of it (``data.py:42, :45``)."""
    convert = "`x = x.astype(np.float32)`" if numpy else "`x = x.float()`"
    advice = f"compute in float32 ({convert} first) and cast to float16 at the end, or on the GPU"
    return f"{_places(lines)}: {advice}" if lines else advice


def _places(lines: list[LineCost]) -> str:
    """The lines, the file named once where they share it: ``data.py:42, :45``."""
    places = [_where(lines[0])]
    places += [f":{line.line}" if line.file == lines[0].file else _where(line) for line in lines[1:]]
    return ", ".join(places)
