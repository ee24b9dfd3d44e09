"""Rules about feeding the model: DataLoader workers, pinned memory."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import DATA_WAIT, Metric, slowest_loader
from gpuscope.diagnose.rules.base import AtRunTime, Finding, rule
from gpuscope.diagnose.speed import (
    FIRST_ROUND_ONLY,
    LoaderPlan,
    back_to_back_share,
    loader_estimate,
    loader_plan,
)
from gpuscope.diagnose.waiting_workers import waiting_workers
from gpuscope.record import Loader, RunRecord
from gpuscope.diagnose.words import speedup_text


@rule(id="more-dataloader-workers",
      title="Give the DataLoader more worker processes",
      fix="DataLoader(..., num_workers=N, persistent_workers=True)",
      needs=("loaders",),
      resolved_by=(DATA_WAIT,),
      trial=AtRunTime(settings={"persistent_workers": True}, requires={
          "num_workers": "this run did not recommend it: no worker count was measured to try"}))
def more_dataloader_workers(run: RunRecord) -> Finding | None:
    """Signal: steps wait for the next batch for a notable share of their time while the loader has fewer
    workers than the machine has cores, or as many and they are mostly blocked (on a CPU or waiting for one under
    WORKERS_MOSTLY_WAITING of the time they ran, as the kernel accounts it: ``_beyond_the_cores``).
    Why it matters: the model idles while Python builds the batch; workers build the next batches meanwhile.
    Fix: DataLoader(num_workers=N, persistent_workers=True), N from the measured times: a batch takes
    T_b = (data wait x workers, or the wait itself with 0 workers) to prepare, the model consumes one every
    (step - wait); N = ceil(T_b / (step - wait)) keeps up, capped at the cores; on a CPU run, where the workers
    take cores from the step, the count up to that one predicting the shortest step (``diagnose.speed.
    loader_estimate``).
    With the loader probe's measured curve (batches/s per worker count, after the run), N is instead the smallest
    measured count delivering at least LOADER_KEEPS_UP_MARGIN more than the step consumes (1 / compute time), or
    the fastest measured one, and the gain is the step it predicts (``diagnose.speed.loader_plan``), where that is
    ``WORKERS_HELP`` shorter at least (a sampler of the user's own, which the main process runs, can leave workers
    2% to save: advised, they ran slower). On a CPU run
    whose intra-op threads and N workers would be more busy threads than cores, the fix also keeps cores - N threads
    (``torch.set_num_threads``), as the prediction assumes. An IterableDataset must split its stream among the
    workers, else each yields all of it: where its code does not, the fix says how (``_split_stream``)."""
    finding, loader = _more_workers(run), slowest_loader(run)
    if finding is None or loader is None or not loader.iterable:
        return finding
    return _split_stream(finding, loader)


def _split_stream(finding: Finding, loader: Loader) -> Finding:
    """``finding`` for a loader over an IterableDataset: whether its workers would split the stream, and where the
    dataset's own code does not, the lines that split it, ahead of the DataLoader change."""
    name = loader.dataset
    if loader.shards_by_worker:
        return replace(finding, evidence=(*finding.evidence, f"the {name} IterableDataset splits its stream among the "
                                          "workers (its code calls torch.utils.data.get_worker_info())"))
    if loader.shards_by_worker is None:
        return replace(finding, evidence=(*finding.evidence, "an IterableDataset: each worker must take its own part "
                                          "of the stream (torch.utils.data.get_worker_info()), else every worker "
                                          "yields all of it"))
    return replace(finding, evidence=(*finding.evidence, (
        f"the {name} IterableDataset's code never calls torch.utils.data.get_worker_info(): with N workers each "
        "would yield the whole stream, N copies of every batch")), fix=f"{finding.fix}\n# and{split_lines(name)}")


def split_lines(dataset: str) -> str:
    """The lines that give each worker of an IterableDataset's loader its own share of the stream (the first a
    comment that goes on ``# and``)."""
    return (f" in {dataset}.__iter__, each worker reads and prepares only its own share of the stream:\n"
            "info = torch.utils.data.get_worker_info()  # None in the main process\n"
            "if info is not None and i % info.num_workers != info.id: continue  # for item i, before any work on it")


def _more_workers(run: RunRecord) -> Finding | None:
    """The finding before an IterableDataset's caveat (see ``more_dataloader_workers``)."""
    share, median, loader = run.breakdown.data_wait, run.steps.median_s, slowest_loader(run)
    cores = run.meta.cpu_count or 1
    if loader is None or share < th.DATA_WAIT_NOTABLE or not median:
        return None
    if loader.num_workers >= cores:
        return _beyond_the_cores(run, loader, share, median, cores)
    plan = loader_plan(run)
    if plan is not None:
        return _from_probe(run, plan, loader, share, median)
    estimate = loader_estimate(run)
    if estimate is None:
        return None
    workers, needed, per_step = estimate.workers, estimate.needed, estimate.batches_per_step
    capped = min(needed, cores)
    evidence = [
        *_waiting_facts(loader, share, median, cores),
        f"a batch takes about {estimate.batch_s / per_step * 1e3:.0f} ms to prepare and the model uses one every "
        f"{estimate.compute_s / per_step * 1e3:.0f} ms{'' if per_step == 1 else f' ({per_step:.3g} a step)'}: "
        f"{needed} workers keep up" +
        (f" ({cores} cores allow {capped})" if capped < needed else ""),
    ]
    if estimate.spread_s is not None:
        evidence.append(f"on this CPU-only run {workers} workers take {workers} of {cores} cores from the step, "
                        f"whose compute keeps the cores they leave; a step's CPU work spread over all of them takes "
                        f"at least {estimate.spread_s * 1e3:.1f} ms")
        if estimate.threads is not None:
            evidence.append(_threads_fact(min(run.meta.torch_threads or 0, cores), workers, cores, estimate.threads))
        evidence.append(f"predicted step {estimate.step_s * 1e3:.1f} ms, {speedup_text(median / estimate.step_s)} "
                        "(an estimate)")
    return Finding(max(0.0, 1 - estimate.step_s / median), tuple(evidence),
                   **_workers_fix(loader, workers, estimate.threads, per_step))


def _beyond_the_cores(run: RunRecord, loader: Loader, share: float, median: float, cores: int) -> Finding | None:
    """Workers as many as the cores and still waited for: more help only if they are mostly blocked (on files, the
    network) rather than on a CPU or waiting for one, as the kernel's accounting of their time tells
    (``host_memory``); the count and the step from ``diagnose.waiting_workers``."""
    waiting = waiting_workers(run)
    memory = run.host_memory
    if waiting is None or memory is None:
        return None
    free, per_step = waiting.free, waiting.batches_per_step
    evidence = [
        *_waiting_facts(loader, share, median, cores),
        f"its workers (the run's child processes but multiprocessing's helpers) were on a CPU or waiting for one "
        f"{waiting.busy:.0%} of the {memory.workers_watched_s:.1f} s they ran (on a CPU {memory.workers_cpu_s:.2f} s, "
        "measured by the kernel): the rest they were blocked (on files, the network), so workers beyond the cores "
        "overlap those waits; "
        + (f"{waiting.fill} that busy bring the step down to its CPU work over the {cores} cores" if waiting.spread_s
           else f"{waiting.fill} that busy fill the {free} core{'s' if free > 1 else ''} the step leaves"),
        f"a batch takes about {waiting.batch_s / per_step * 1e3:.0f} ms to prepare and the model uses one every "
        f"{waiting.compute_s / per_step * 1e3:.0f} ms: {waiting.needed} workers keep up"
        + (f", {waiting.fill} fit" if waiting.fill < waiting.needed else ""),
        f"predicted step {waiting.step_s * 1e3:.1f} ms, {speedup_text(median / waiting.step_s)} (an estimate, at best"
        + (f": a step's CPU work spread over the {cores} cores takes {waiting.spread_s * 1e3:.1f} ms)"
           if waiting.spread_s else ")"),
    ]
    if memory.max_workers and memory.peak_workers_bytes:
        each = memory.peak_workers_bytes / memory.max_workers
        evidence.append(f"each worker held up to {each / 2**20:.0f} MB resident (pages shared with the main process "
                        f"counted in each): {waiting.workers} would hold about {waiting.workers * each / 2**30:.1f} GB")
    return Finding(max(0.0, 1 - waiting.step_s / median), tuple(evidence),
                   **_workers_fix(loader, waiting.workers, None, per_step))


def _waiting_facts(loader: Loader, share: float, median: float, cores: int) -> list[str]:
    """The evidence a worker count is worked out from the run's times opens with: the wait, the workers against
    the cores, and where the loader was built."""
    return [f"{share:.0%} of each step waits for the next batch (median step {median * 1e3:.1f} ms)",
            f"the {loader.dataset} loader has {loader.num_workers} workers; this machine has {cores} cores",
            *built_at(loader)]


def _threads_fact(threads: int, workers: int, cores: int, keep: int) -> str:
    return (f"torch runs {threads} intra-op threads in the main process: with {workers} busy workers that is more "
            f"busy threads than the {cores} cores, and threads that wait for each other at every parallel op stall "
            f"the step; keep {keep} (torch.set_num_threads({keep}))")


def built_at(loader: Loader) -> list[str]:
    """Where the loader was built, as a fact (none when it was not seen)."""
    site = loader.created_at
    if site is None or not site.file:
        return []
    line = f"{site.file}:{site.line} `{site.code}`"
    if loader.created_by:
        return [f"the {loader.dataset} loader is built inside {loader.created_by}, called from {line}"]
    return [f"the {loader.dataset} loader is built at {line}"]


def _workers_fix(loader: Loader, workers: int, threads: int | None, per_step: float = 1.0) -> dict[str, Any]:
    """The change as values (``Finding.settings``) and as code written from them: the loader's arguments (the
    Trainer's, when transformers built it), the thread count if one is advised, and the line it goes on."""
    settings: dict[str, object] = {"num_workers": workers, "persistent_workers": True,
                                   **_prefetch(loader, workers, per_step), **_site(loader)}
    fix = loader_arguments(loader, settings)
    if threads is not None:
        settings["threads"] = threads
        fix += f"  and  torch.set_num_threads({threads})"
    return {"fix": fix + site_comment(loader), "settings": settings}


def _prefetch(loader: Loader, workers: int, per_step: float) -> dict[str, object]:
    """``prefetch_factor`` where ``workers`` holding their prefetched batches (2 each by default) hold fewer than the
    ``per_step`` batches a step takes: a loop that takes them all at once (the transformers Trainer fetches a step's
    accumulated batches before the first forward) waits for the rest to be built. None where they hold enough."""
    needed = math.ceil(round(per_step, 1) / workers) if workers else 0
    return {"prefetch_factor": needed} if needed > (loader.prefetch_factor or 2) else {}


def _site(loader: Loader) -> dict[str, object]:
    """The line a loader fix goes on, where it is known: that of the script that built the loader (or called the
    library that did); the comment ``site_comment`` writes names it."""
    site = loader.created_at
    return {"site": f"{site.file}:{site.line}"} if site is not None and site.file else {}


LOADER_ARGUMENTS = ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory")
"""The DataLoader's arguments a loader fix sets, in the order it writes them."""


def loader_arguments(loader: Loader, settings: dict[str, object]) -> str:
    """``DataLoader(..., num_workers=4, persistent_workers=True)`` written from ``settings`` (the Trainer's
    ``dataloader_``-prefixed arguments where transformers built the loader)."""
    named = [(name, settings[name]) for name in LOADER_ARGUMENTS if name in settings]
    return loader_call(loader, ", ".join(f"dataloader_{name}={value}" for name, value in named),
                       ", ".join(f"{name}={value}" for name, value in named))


def loader_call(loader: Loader, trainer_args: str, loader_args: str) -> str:
    """The call a loader fix changes: ``TrainingArguments(..., trainer_args)`` where the Trainer built the loader,
    else ``DataLoader(..., loader_args)``."""
    if loader.created_by == "transformers":
        return f"TrainingArguments(..., {trainer_args})"
    return f"DataLoader(..., {loader_args})"


def site_comment(loader: Loader) -> str:
    """Where the change goes, as a comment after the fix: ``  # train.py:37`` (``  # transformers, called from
    train.py:52`` when a library built the loader); empty when that is not known."""
    site = _site(loader)
    return f"  # {loader.created_by + ', called from ' if loader.created_by else ''}{site['site']}" if site else ""


def _from_probe(run: RunRecord, plan: LoaderPlan, loader: Loader, share: float, median: float) -> Finding | None:
    """The finding from the loader probe's curve (None when the probe finds no more workers worth having, or the
    step they predict is no shorter)."""
    if plan.workers <= loader.num_workers or plan.step_s > median * (1 - th.WORKERS_HELP):
        return None  # workers worth having shorten the step by WORKERS_HELP at least (as cheaper-batches holds)
    dataset = loader.dataset
    probe = run.loader_probe
    curve = ", ".join(f"{r.num_workers}: {r.batches_per_s:.1f}" for r in probe.rates  # type: ignore[union-attr]
                      if r.batches_per_s and not r.pin_memory)
    evidence = [
        f"{share:.0%} of each step waits for the next batch (median step {median * 1e3:.1f} ms)",
        *built_at(loader),
        f"measured after the run, the {dataset} loader alone delivers (workers: batches/s) {curve}",
        f"the training step consumes {plan.consume_batches_per_s:.1f} batches/s "
        f"({plan.batches_per_step:.3g} per {plan.compute_s * 1e3:.1f} ms of compute)",
    ]
    rate = plan.rate.batches_per_s or 0.0
    if plan.keeps_up:
        evidence.append(f"{plan.workers} workers are the fewest that keep up ({rate:.1f} batches/s, at least "
                        f"{1 + th.LOADER_KEEPS_UP_MARGIN:.1f}x the consumption)")
    else:
        evidence.append(f"no measured worker count keeps up; {plan.workers} deliver the most ({rate:.1f} batches/s)")
        evidence.append(_what_would_keep_up(run, plan))
    if plan.shared_cpu_s is not None:
        evidence.append(f"on this CPU-only run the workers share {run.meta.cpu_count} cores with the step: its "
                        f"compute keeps the cores the workers leave, and a step's CPU work spread over all of them "
                        f"takes at least {plan.shared_cpu_s * 1e3:.1f} ms")
    receive, back = plan.rate.receive_s or 0.0, back_to_back_share(run)
    if receive > (plan.rate.handover_s or 0.0) and back > 0:
        evidence.append(f"receiving a batch the workers have built takes the main process {receive * 1e3:.2f} ms while "
                        "they build the next (timed by the probe: each tensor's hand-over waits for the worker's "
                        f"Python), added to the step's compute for the {back:.0%} of its batches the loop takes back "
                        f"to back ({plan.handover_s * 1e3:.1f} ms a step)")
    elif plan.rate.handover_s:
        evidence.append(f"receiving a batch from the workers costs the main process {plan.rate.handover_s * 1e3:.2f} "
                        "ms of CPU (timed by the probe), added to the step's compute")
    if plan.threads is not None:
        threads = run.loader_probe.main_threads or 0  # type: ignore[union-attr]
        evidence.append(_threads_fact(threads, plan.workers, run.meta.cpu_count or 1, plan.threads))
    evidence.append(f"predicted step {plan.step_s * 1e3:.1f} ms, {speedup_text(median / plan.step_s)} (an estimate)")
    gain = max(0.0, 1 - plan.step_s / median)
    return Finding(gain, tuple(evidence), **_workers_fix(loader, plan.workers, plan.threads, plan.batches_per_step))


def _what_would_keep_up(run: RunRecord, plan: LoaderPlan) -> str:
    """When no worker count on this machine hides the loading: what would (more cores, cheaper batches)."""
    probe = run.loader_probe
    one = next((r.batches_per_s for r in probe.rates if r.num_workers == 1 and r.batches_per_s), None)  # type: ignore[union-attr]
    needed = plan.consume_batches_per_s * (1 + th.LOADER_KEEPS_UP_MARGIN)
    cores = run.meta.cpu_count or 1
    more = ""
    if one and math.ceil(needed / one) + 1 > cores:  # the workers, and a core for the step
        more = (f"about {math.ceil(needed / one)} workers at the one-worker rate ({one:.1f} batches/s) and a core "
                f"for the step, so more than the {cores} cores here, or ")
    elif one:
        more = (f"workers that scale ({plan.workers} deliver {plan.rate.batches_per_s:.1f} batches/s, not "
                f"{plan.workers}x the one-worker {one:.1f}: look for a lock or a shared resource), or ")
    return (f"loading cannot be hidden on this machine: it would take {more}cheaper batches (preprocessing done once "
            f"ahead of training, lighter transforms; the data probe's slowest lines say where the time goes)")


def _pageable_copies(record: RunRecord) -> float | None:
    ops = record.op_profile
    kernels = ops.kernels if ops is not None else None
    return kernels.h2d_pageable_copies / ops.steps if kernels is not None and ops is not None and ops.steps else None


@rule(id="pin-memory",
      title="Pin the DataLoader's memory and copy without blocking",
      fix="DataLoader(..., pin_memory=True)  and  batch.to(device, non_blocking=True)",
      needs=("cuda", "loaders", "kernels"),
      resolved_by=(Metric("pageable copies per step", "number", _pageable_copies), DATA_WAIT),
      trial=AtRunTime(settings={"pin_memory": True}))
def pin_memory(run: RunRecord) -> Finding | None:
    """Signal: host-to-device copies come from pageable memory while a loader runs without pin_memory.
    Why it matters: pageable copies are staged through a pinned buffer by the driver, about half the speed of
    copies from pinned memory, and they cannot overlap with compute.
    Fix: DataLoader(pin_memory=True) and .to(device, non_blocking=True)."""
    kernels = run.op_profile.kernels  # type: ignore[union-attr]
    unpinned = [l for l in run.loaders if not l.pin_memory]
    if not unpinned or not kernels.h2d_pageable_copies:  # type: ignore[union-attr]
        return None
    window_s = run.steps.median_s * max(1, run.op_profile.steps)  # type: ignore[union-attr]
    copy_share = min(1.0, kernels.h2d_copy_s / window_s) if window_s else 0.0  # type: ignore[union-attr]
    evidence = (
        f"{kernels.h2d_pageable_copies} of {kernels.h2d_copies} host-to-device copies in the profiled steps came "  # type: ignore[union-attr]
        f"from pageable memory, {kernels.h2d_copy_s * 1e3:.2f} ms in all ({copy_share:.0%} of the steps' time)",  # type: ignore[union-attr]
        f"the {unpinned[0].dataset} loader has pin_memory=False",
        *built_at(unpinned[0]),
    )
    comment = site_comment(unpinned[0])
    if not comment:
        return Finding(copy_share * th.PINNED_COPY_SAVING, evidence)
    settings = {"pin_memory": True, **_site(unpinned[0])}
    pin = loader_arguments(unpinned[0], settings)
    if unpinned[0].created_by != "transformers":  # the Trainer moves its batches itself
        pin += "  and  batch.to(device, non_blocking=True)"
    return Finding(copy_share * th.PINNED_COPY_SAVING, evidence, fix=pin + comment, settings=settings)


def _restart_share(run: RunRecord) -> float | None:
    """The share of the run's step time spent waiting for workers to start again (each epoch's new iterator)."""
    waited = sum(loader.restart_wait_s for loader in run.loaders)
    steps = run.steps
    if not steps.count:
        return None
    restarts = sum(loader.restarts for loader in run.loaders)
    total = steps.mean_s * max(0, steps.total - restarts) + waited
    return waited / total if total > 0 else None


@rule(id="persistent-workers",
      title="Keep the DataLoader's workers between epochs",
      fix="DataLoader(..., persistent_workers=True)",
      needs=("loaders",),
      resolved_by=(Metric("waiting for workers to restart", "share", _restart_share), DATA_WAIT),
      trial=AtRunTime(settings={"persistent_workers": True}))
def persistent_workers(run: RunRecord) -> Finding | None:
    """Signal: a loader with worker processes and no ``persistent_workers`` started them again for a new iterator
    (each epoch, each validation pass), and the loop waited for each restart's first batch.
    Why it matters: each new iterator starts every worker again (under spawn, a fresh Python that imports torch and
    unpickles the dataset: seconds) and waits for the first batch; persistent workers are started once.
    Fix: DataLoader(..., persistent_workers=True) (the Trainer's dataloader_persistent_workers); where the script's
    line built a new DataLoader each epoch, built once, before the loop over epochs, as well.
    Gain: the measured restart waits' share of the run's step time (the mean steady step over the other steps)."""
    restarted = [l for l in run.loaders if l.restarts and not l.persistent_workers]
    share = _restart_share(run)
    if not restarted or not share:
        return None
    loader = max(restarted, key=lambda l: l.restart_wait_s)
    method = f" {loader.start_method}" if loader.start_method else ""
    evidence = (
        f"the {loader.dataset} loader started its {loader.num_workers}{method} workers again {loader.restarts} "
        f"time{'s' if loader.restarts != 1 else ''} after the first (a new iterator each {_iterated_for(loader)}), "
        f"and the loop waited {loader.restart_wait_s:.2f} s in all for the first batch after each restart",
        f"that is {share:.0%} of the run's step time (the {run.steps.mean_s * 1e3:.1f} ms mean steady step over "
        f"the {run.steps.total} steps, and the restarts' waits)",
        *built_at(loader),
    )
    # the other loaders that started their workers again (a validation loader beside the training one): theirs
    # count in the gain, and their lines take the same change
    others = [other for other in restarted if other is not loader and _site(other) and not other.created_by
              and _site(other) != _site(loader)]
    evidence = (*evidence, *(f"the {other.dataset} loader built at {_site(other)['site']} started its workers again "
                             f"{other.restarts} time{'s' if other.restarts != 1 else ''} too "
                             f"({other.restart_wait_s:.2f} s)" for other in others))
    settings = {"persistent_workers": True, **_site(loader)}
    fix = loader_arguments(loader, settings)
    site = loader.created_at
    if site is not None and site.calls > 1 and not loader.created_by:  # the script's line builds a loader each epoch
        each = _iterated_for(loader)
        evidence = (*evidence, f"that line built {site.calls} DataLoaders over it, a new one each {each}: each starts "
                               f"its workers afresh, persistent_workers or not")
        fix = f"{fix}, built once, before the loop" if "evaluation" in each else \
            f"{fix}, built once before the loop over epochs"
    comment = site_comment(loader) + "".join(f", {_site(other)['site']}" for other in others)
    return Finding(share, evidence, fix=fix + comment, settings=settings)


def _iterated_for(loader: Loader) -> str:
    """What each new iterator of ``loader`` was for: its batches all an evaluation pass's (the Transformers Trainer's
    evaluation loader, built again for each pass), none, or some."""
    if loader.eval_batches >= loader.batches:
        return "evaluation pass"
    return "epoch or evaluation pass" if loader.eval_batches else "epoch"


FILE_SYSTEM_FIX = 'torch.multiprocessing.set_sharing_strategy("file_system")  # before the DataLoader starts its workers'
"""The file-system-sharing rule's fix (its finding's adds the worker count to use where that changes)."""


@rule(id="file-system-sharing",
      title="Hand batches over from the workers as shared-memory files",
      fix=FILE_SYSTEM_FIX,
      needs=("loaders", "loader_probe"),
      resolved_by=(DATA_WAIT,),
      trial=AtRunTime())
def file_system_sharing(run: RunRecord) -> Finding | None:
    """Signal: the loader probe timed handing a built batch over while the workers built the next as milliseconds
    (each tensor's file descriptor waits for the worker's Python, which a collate function written in Python holds),
    and the same workers timed again with the file_system sharing strategy predict a step ``FILE_SYSTEM_SHORTER``
    shorter than the median step and than the best plan without it.
    Why it matters: a step pays the hand-over for every batch it takes, even where the workers keep up.
    Fix: torch.multiprocessing.set_sharing_strategy("file_system") before the DataLoader starts its workers
    (workers started by fork inherit it; under spawn, in worker_init_fn too), with the probe's worker count.
    Not advised where the file_system timing got its first round only (a lower bound, which the analysis would
    complete from the run's batch time) while the same count without it was timed over whole rounds: an estimate
    of ideal workers against a measurement is no comparison.
    Gain: the step the probe's file_system timing predicts (``diagnose.speed.loader_plan``)."""
    share, median, loader = run.breakdown.data_wait, run.steps.median_s, slowest_loader(run)
    plan = loader_plan(run, file_system=True)
    if share < th.DATA_WAIT_NOTABLE or plan is None or loader is None or not median:
        return None
    default = loader_plan(run)
    best = min(median, default.step_s) if default is not None else median
    if plan.step_s > best * (1 - th.FILE_SYSTEM_SHORTER):
        return None
    described = run.loader_probe.rates  # type: ignore[union-attr]
    fd = next((r for r in described if r.num_workers == plan.workers and not r.pin_memory), None)
    timed = run.loader_probe.file_system  # type: ignore[union-attr]
    if timed is not None and fd is not None and FIRST_ROUND_ONLY in timed.note and FIRST_ROUND_ONLY not in fd.note:
        return None  # its first round only, against whole rounds without it: no comparison
    received = (f"it took {plan.rate.receive_s * 1e3:.1f} ms" if plan.rate.receive_s is not None
                else "its hand-over was not timed")
    evidence = [
        f"{share:.0%} of each step waits for the next batch (median step {median * 1e3:.1f} ms)",
        *built_at(loader),
        f"handing a batch the {loader.dataset} loader's {plan.workers} workers had built over to the main process "
        f"took {(fd.receive_s or 0.0) * 1e3:.1f} ms while they built the next (timed by the probe: with the default "
        "file_descriptor strategy each tensor waits for the worker's Python to pass it)" if fd is not None else "",
        f"with the file_system strategy {received} ({plan.rate.batches_per_s:.1f} batches/s); the loop takes "
        f"{back_to_back_share(run):.0%} of its batches back to back, while the workers build the next",
        f"predicted step {plan.step_s * 1e3:.1f} ms, {speedup_text(median / plan.step_s)} (an estimate)"
        + (f", against {default.step_s * 1e3:.1f} ms for {default.workers} workers without it" if default else ""),
    ]
    fix, settings = FILE_SYSTEM_FIX, {}
    prefetch = _prefetch(loader, plan.workers, plan.batches_per_step)
    if plan.workers > loader.num_workers or prefetch:
        settings = {"num_workers": plan.workers, **prefetch, **_site(loader)}
        fix += f"; then {loader_arguments(loader, settings)}{site_comment(loader).replace('  #', ' at', 1)}"
    return Finding(max(0.0, 1 - plan.step_s / median), tuple(e for e in evidence if e), fix=fix, settings=settings)
