"""The verdict: what bounds the run, from the record's measurements, with the numbers it rests on.

In order:
1. no step: inconclusive; fewer steady-state steps than a median needs: the verdict of those there are, its confidence
   cut in proportion; none unprofiled (a run of a few long steps): the profiled steps' verdict, cut by half again;
2. data-loading: the step waits for the next batch (on CUDA, the GPU's timeline does);
   then communication: the training thread waits on collectives (a data-parallel job's all-reduce) half the step;
3. on CUDA, the kernel timeline (or, without one, NVML's utilisation): a busy GPU is compute-bound, a GPU starved
   while the host is late launching is CPU-launch-bound;
4. on a CPU run, the ops issued per step times this machine's measured fixed cost per op, against the step's time:
   mostly overhead is CPU-launch-bound, mostly arithmetic is compute-bound; the mean op's self time against that
   fixed cost tells tiny ops (launch-bound even when a noisy machine shrinks the share) from ops with work in them.
Every threshold is in thresholds.py.
"""

from __future__ import annotations

import dataclasses
import statistics

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.child_processes import child_processes, notable
from gpuscope.diagnose.clock import HostPace
from gpuscope.diagnose.contention import contention
from gpuscope.diagnose.evidence import accumulated_passes, comm_share, cpu_overhead, launch_wait, slowest_loader
from gpuscope.diagnose.gpu_step import GpuStep, gpu_step
from gpuscope.diagnose.iterator_wait import iterator_wait
from gpuscope.diagnose.loops import loops_line
from gpuscope.diagnose.rules.base import missing_input
from gpuscope.diagnose.words import (comm_flight_text, comm_wait_text, evaluation_line, frozen_model_text, gpu_busy,
                                     host_pace_text, left_out, two_speeds_line, unlike_window)
from gpuscope.record import Breakdown, CallSite, FunctionStat, RunRecord, Steps, Verdict, Window
from gpuscope.reduce.trace import is_communication_op


HOW_TO_MARK_STEPS = (
    "no training step was found: nothing called optimizer.step() or backward(), nor iterated a DataLoader; mark "
    "the end of each step with gpuscope.step() (`import gpuscope`; it does nothing when gpuscope is not running)")


def classify(record: RunRecord) -> Verdict:
    """The verdict on ``record``, with its confidence and the numbers it rests on (and, where the script ran several
    training loops, which one the figures are; where the steps run at two speeds, that the median step stands for a
    mix; where evaluation passes took a notable time, what they took; where processes the script started did
    notable work, that it is not in the figures; where the process waited for a core a notable share of its time,
    that the step times hold that wait)."""
    verdict = _classify(record)
    more = [line for line in (loops_line(record), two_speeds_line(record), evaluation_line(record)) if line] \
        if record.steps.count else []
    if children := child_processes(record):  # said with steps or without
        more.append(children)
    if (died := out_of_memory_line(record)) is not None:
        return Verdict(verdict.bound, verdict.confidence, (died, *verdict.evidence, *more))
    if record.steps.count and (waited := contention(record)):
        more.append(waited)
    return Verdict(verdict.bound, verdict.confidence, (*verdict.evidence, *more)) if more else verdict


def out_of_memory_line(record: RunRecord) -> str | None:
    """Where the script died of a failed allocation: that, and what was live then (the verdict's first line)."""
    memory = record.memory
    died = memory.out_of_memory if memory is not None else None
    if died is None:
        return None
    live = {"parameters": died.parameters_bytes, "gradients": died.gradients_bytes,
            "optimizer state": died.optimizer_state_bytes, "activations saved for backward": died.activations_bytes,
            "other tensors": died.other_bytes}
    held = ", ".join(f"{name} {n / 1e6:.1f} MB" for name, n in live.items() if n)
    asked = f" (asked for {died.requested_bytes / 1e6:.1f} MB)" if died.requested_bytes else ""
    return (f"the script ran out of memory at step {died.step}: {died.error}{asked}"
            + (f"; live {died.device.upper()} tensors then: {held}" if held else ""))


def _classify(record: RunRecord) -> Verdict:
    """The verdict; on fewer steady steps than a median needs (a run of a few long steps), the same verdict from
    the steps there are, its confidence cut in proportion and the evidence saying so (``_thin``)."""
    steps = record.steps
    needed = th.MIN_TRACE_STEPS if steps.source == "profiler" else th.MIN_STEADY_STEPS
    if (profiled := profiled_figures(record)) is not None:
        thin_steps, breakdown, which = profiled
        thin = dataclasses.replace(record, steps=thin_steps, breakdown=breakdown)
        measured = _classify_steps(thin, needed)  # (inconclusive too: its evidence says why, "0 steps" would not)
        them = "it" if thin_steps.count == 1 else "them"
        line = (f"thin evidence: no step ran unprofiled ({steps.total} in all; {left_out(record)}): the "
                f"verdict is that of {which}, slowed by the profiler on in {them}; the confidence is cut to "
                f"{thin_steps.count} in {2 * needed} of its own")
        return Verdict(measured.bound, round(measured.confidence * thin_steps.count / (2 * needed), 2),
                       (line, *measured.evidence))
    verdict = _classify_steps(record, needed)
    if 0 < steps.count < needed:  # an inconclusive one too: its evidence says from how few steps
        return _thin(record, verdict, needed)
    return verdict


def profiled_figures(record: RunRecord) -> tuple[Steps, Breakdown, str] | None:
    """Where no step ran unprofiled, ``profiled_steps`` of the record's steps, as torch.profiler recorded them (its
    window, and the one closure call it traced); None elsewhere."""
    ops = record.op_profile
    if record.steps.count:
        return None
    call = (ops.closure_calls, ops.closure_call_s) if ops is not None and ops.closure_call_s > 0 else None
    return profiled_steps(record.steps, ops.window if ops is not None else None, call)


def profiled_steps(steps: Steps, window: Window | None = None,
                   call: tuple[int, float] | None = None) -> tuple[Steps, Breakdown, str] | None:
    """Where no step ran unprofiled (a run of a few long steps), the step figures and breakdown its profiled steps
    give: those torch.profiler recorded (``window``) where it recorded any (their op table is the one the verdict
    reads), else all of them; and which steps they were. None where no profiled step was kept. ``call``: the one
    recorded step was recorded up to the end of its first closure call, of that many, which took that long: the
    step's time is the call's times its calls, as its op table is (its wall also holds the trace's export and the
    FLOP count of its second call)."""
    sample = steps.sample
    profiled = [i for i, status in enumerate(sample.status) if status == "profiled"]
    if window is not None and window.first_step is not None and window.last_step is not None:
        traced = [i for i in profiled if window.first_step <= sample.index[i] <= window.last_step]
        profiled = traced or profiled
    if not profiled:
        return None
    device = steps.clock == "device" and len(sample.device_wall_s) == len(sample.wall_s)
    walls = [(sample.device_wall_s[i] or sample.wall_s[i]) if device else sample.wall_s[i] for i in profiled]
    timed = ""
    if call is not None and len(profiled) == 1 and window is not None \
            and sample.index[profiled[0]] == window.first_step:
        timed = (f" (its time taken as its first call of the optimizer's closure, traced, {call[1]:.2f} s, times "
                 f"its {call[0]} calls: its wall, {walls[0]:.2f} s, also holds the trace's export and the step's "
                 "other profilers)")
        walls = [call[0] * call[1]]
    total = sum(sample.wall_s[i] for i in profiled)  # the phases are the host's
    shares = {phase: sum(column[i] for i in profiled) / total if total else 0.0
              for phase, column in sample.phases_s.items()}
    thin = dataclasses.replace(steps, count=len(profiled), median_s=statistics.median(walls),
                               mean_s=sum(walls) / len(walls), min_s=min(walls), max_s=max(walls))
    first, last = sample.index[profiled[0]], sample.index[profiled[-1]]
    which = f"the profiled step {first}{timed}" if first == last else f"the profiled steps {first}-{last}"
    return thin, Breakdown(**shares), which


def _thin(record: RunRecord, verdict: Verdict, needed: int) -> Verdict:
    steps = record.steps
    were = "step was" if steps.count == 1 else "steps were"
    line = (f"thin evidence: only {steps.count} steady-state {were} measured ({steps.total} in all; "
            f"{left_out(record)}), of the {needed} a median needs; the confidence is cut to {steps.count} in "
            f"{needed} of its own")
    return Verdict(verdict.bound, round(verdict.confidence * steps.count / needed, 2), (line, *verdict.evidence))


def _classify_steps(record: RunRecord, needed: int) -> Verdict:
    """The verdict the record's steps give, whatever their number (``needed``: how many give full confidence)."""
    steps = record.steps
    if steps.count == 0:
        evidence = [f"only 0 steady-state steps were measured ({steps.total} step{'s' * (steps.total != 1)} "
                    f"in all; {left_out(record)}); at least one is needed, {needed} for full confidence"]
        if steps.total == 0:
            evidence.append(_why_no_step(record))
        return Verdict("inconclusive", 0.0, tuple(evidence))
    share = record.breakdown.data_wait
    basis = "of the GPU's step time" if steps.breakdown_basis == "device" else "of each step"
    if share >= th.DATA_WAIT_BOUND:
        evidence = [f"{share:.0%} {basis} waits for the next batch (median step {steps.median_s * 1e3:.1f} ms, "
                    f"{steps.count} steady-state steps)"]
        if (top := slowest_loader(record)) is not None:
            evidence.append(f"the {top.dataset} loader has {top.num_workers} worker process"
                            f"{'es' if top.num_workers != 1 else ''}")
        if steps.queue_waits:
            evidence.append(queue_wait_text(steps.queue_waits[0], top is not None))
        return Verdict("data-loading", _rising(share, th.DATA_WAIT_BOUND, 0.5), tuple(evidence))
    site = steps.queue_waits[0] if steps.queue_waits and share >= th.DATA_WAIT_NOTABLE else None
    where = f" (at {site.file}:{site.line} `{site.code}`, on a queue)" if site is not None else ""
    waiting = (f"data wait is {share:.0%} {basis}{where}, under the {th.DATA_WAIT_BOUND:.0%} at which loading bounds "
               "the run")
    comm = record.op_profile.communication if record.op_profile is not None else None
    if comm is not None and (exposed := comm_share(comm, steps.median_s)) >= th.COMM_BOUND:
        return Verdict("communication", _rising(exposed, th.COMM_BOUND, 0.9), (
            comm_wait_text(comm, steps.median_s), comm_flight_text(comm), waiting))
    waits = (waiting,)
    if comm is not None and comm.calls_per_step:  # as the data wait: the job's other wait, under its bar
        who = "the device" if comm.measured_on == "device" else "the training thread"
        waits += (f"{who} waits on the collectives' own work {exposed:.0%} of each step ({comm_flight_text(comm)}), "
                  f"under the {th.COMM_BOUND:.0%} at which communication bounds the job",)
    unlike = unlike_window(record)
    if unlike is not None:
        return Verdict("inconclusive", 0.2, (f"launch-bound or compute-bound cannot be told: {unlike}", *waits))
    verdict = _classify_cuda(record) if record.device == "cuda" else _classify_cpu(record)
    if verdict.bound == "data-loading":  # waiting on an iterator of the script's own (_waiting_iterator)
        return verdict
    return Verdict(verdict.bound, verdict.confidence, (*verdict.evidence, *waits, *_between_phases(record)))


def _between_phases(record: RunRecord) -> list[str]:
    """Where the step's ``other`` phase is notable, the functions the loop ran there, by the Python profile
    (``python_profile.between_phases``), each with its share of the profiled steps' time."""
    profile, other = record.python_profile, record.breakdown.other
    if profile is None or other < th.OTHER_NAMED or not profile.between_phases:
        return []
    loop_s = profile.total_s - profile.startup_s
    named = [f for f in profile.between_phases if loop_s > 0 and f.cumulative_s >= th.BETWEEN_PHASES_NAMED * loop_s]
    if not named:
        return []
    window = profile.window
    steps = "the whole run" if profile.whole_run else f"steps {window.first_step}-{window.last_step}"
    said = ", ".join(f"{f.function} ({f.file}:{f.line}) {f.cumulative_s / loop_s:.0%}" for f in named)
    return [f"other is {other:.0%} of each step: the code the loop runs between the phases, which the Python profile "
            f"({steps}) finds in {said} of its time"]


def _why_no_step(record: RunRecord) -> str:
    """Why no step was found: a script that failed before its first step ended says so (its traceback is above
    the summary); one that started processes of its own and iterated no DataLoader most likely trained in them
    (``torch.multiprocessing.spawn``, as pytorch/examples' data-parallel scripts do); any other needs its steps
    marked. Where the processes it started are known (``child_processes``), the verdict's next line tells of them."""
    memory = record.host_memory
    if record.exit_status == 0 and notable(record):
        return "no training step was found in the script's own process"
    if record.exit_status == 0 and memory is not None and memory.max_workers and not any(
            loader.batches for loader in record.loaders):
        children = f"{memory.max_workers} child process{'es' if memory.max_workers != 1 else ''}"
        return (f"no training step was found in the script's own process, and {children} ran beside it "
                f"({memory.peak_workers_bytes / 2**20:.0f} MiB at their peak) while it iterated no DataLoader: if the "
                "training ran in them (torch.multiprocessing.spawn, multiprocessing), profile one of them from "
                "inside: `with gpuscope.profile():` around the loop of the function they run (rank 0's is enough)")
    if record.exit_status == 0:
        return HOW_TO_MARK_STEPS
    batches = sum(loader.batches for loader in record.loaders)
    got_to = f", after {batches} batch{'es' if batches != 1 else ''} from its DataLoader" if batches else ""
    return (f"the script ended with exit status {record.exit_status}{got_to}, before its first training step ended: "
            "there is nothing to measure until it gets that far")


def _ops_ran(covered: float, median_s: float, data_wait: float = 0.0) -> str:
    """How long the traced steps' torch ops ran against the median step (less its ``data_wait`` share, where the
    ops that built batches in the DataLoader's ``__next__`` are left out of ``covered``); where the traced steps ran
    slower than the median (early steps, still growing their memory), more than the step, which is said."""
    step = median_s * (1 - data_wait)
    of = (f"of the {step * 1e3:.2f} ms of the step outside its data wait" if data_wait else
          f"of the {median_s * 1e3:.2f} ms step")
    text = f"torch ops ran {covered * 1e3:.2f} ms {of} ({min(covered / step, 1):.0%}"
    return text + (": the traced steps ran slower than the median)" if covered > step else ")")


def _classify_cpu(record: RunRecord) -> Verdict:
    ops, steps = record.op_profile, record.steps
    overhead = cpu_overhead(record)
    if overhead is None:
        missing = missing_input(record, ("op_profile", "calibration")) or "no step time"
        return Verdict("inconclusive", 0.0, (f"launch-bound or compute-bound cannot be told: {missing}",))
    share = overhead.share
    mean_op_s = ops.compute_mean_op_s  # type: ignore[union-attr]  # (the DataLoader's own ops are the data wait's)
    ratio = mean_op_s / overhead.op_cost_s
    loading = ops.ops_per_step - overhead.ops_per_step  # type: ignore[union-attr]
    loading = loading if loading >= th.LOADER_OPS_NOTABLE * ops.ops_per_step else 0.0  # type: ignore[union-attr]
    besides = (f" (besides {loading:.0f} a step building its batches in the DataLoader's __next__, the data wait's "
               "work)") if loading else ""
    facts = [
        f"{overhead.ops_per_step:.0f} torch ops per step{besides} at {overhead.op_cost_s * 1e6:.2f} us of fixed cost "
        f"each (measured here on tiny tensors) make {overhead.seconds * 1e3:.2f} ms: {share:.0%} of the "
        f"{steps.median_s * 1e3:.2f} ms step",
        f"mean op self time {mean_op_s * 1e6:.1f} us, {ratio:.1f}x the fixed cost of an op",
    ]
    data_wait = record.breakdown.data_wait if loading else 0.0
    compute_s = steps.median_s * (1 - data_wait)  # what the ops counted can explain
    if share >= th.LAUNCH_BOUND_OVERHEAD:
        return Verdict("cpu-launch", _rising(share, th.LAUNCH_BOUND_OVERHEAD, 0.9), tuple(facts))
    covered = overhead.ops_per_step * mean_op_s
    if share <= th.COMPUTE_BOUND_MAX_OVERHEAD and covered < th.OPS_COVER_STEP * compute_s:
        ran = _ops_ran(covered, steps.median_s, data_wait)
        outside = f"{ran}: most of the step is spent outside torch ops, neither " \
                  "computing nor waiting for a DataLoader"
        return _waiting_iterator(record, outside, facts) or Verdict(
            "inconclusive", 0.3, (outside, *_outside_ops(record), *facts))
    if share > th.COMPUTE_BOUND_MAX_OVERHEAD and ratio <= th.TINY_OP_RATIO:
        facts.append(f"the ops are tiny (mean self time at most {th.TINY_OP_RATIO:.0f}x their fixed cost): the step "
                     "is made of per-op overhead, not arithmetic")
        return Verdict("cpu-launch", _rising(th.TINY_OP_RATIO / max(ratio, 1e-9), 1.0, th.TINY_OP_RATIO), tuple(facts))
    if share <= th.COMPUTE_BOUND_MAX_OVERHEAD and ratio <= th.TINY_OP_RATIO:
        spent = covered / compute_s
        facts.append(f"the ops are tiny yet their fixed cost explains only {share:.0%} of the step, their own time "
                     f"{spent:.0%} of it" + (": most of the step is spent outside torch ops" if spent < 0.5 else ""))
        if (passes := accumulated_passes(record)) is not None:  # the rest is each pass's Python, paid k times
            mfu = record.speed_of_light.mfu  # type: ignore[union-attr]
            facts.append(f"each step runs {passes} forward and backward passes, one a batch (gradients accumulated), "
                         f"its arithmetic at {mfu:.1%} of the peak: the passes' fixed cost (Python, the ops' launches, "
                         "autograd) bounds it")
            return Verdict("cpu-launch", 0.5, tuple(facts))
        return Verdict("inconclusive", 0.3, tuple(facts))
    other = record.breakdown.other
    if share <= th.COMPUTE_BOUND_MAX_OVERHEAD and other >= th.OUTSIDE_MODEL_DOMINANT:
        outside = f"{other:.0%} of each step is spent outside the model's forward and backward, the optimizer and " \
                  "DataLoader waits"
        if covered < th.OPS_COVER_OUTSIDE_MODEL * compute_s:
            outside += ": in the script's own code between them (batches built without a DataLoader, logging, an " \
                       "environment's steps)"
            return _waiting_iterator(record, outside, facts) or Verdict(
                "inconclusive", 0.3, (outside, *_outside_ops(record), *facts))
        # the arithmetic is in torch ops all the same, outside the trained model (a frozen teacher under no_grad)
        frozen = [f for f in steps.frozen_models if (f.step_share or 0.0) >= th.FROZEN_MODEL_NOTABLE]
        ran = _ops_ran(covered, steps.median_s, data_wait)
        facts.insert(0, f"{outside}, yet {ran}: computing outside the trained model's "
                        "forward and backward " + ("in a model it does not train: " + "; ".join(
                            frozen_model_text(f) for f in frozen) if frozen
                            else "(a model run without gradients, a loss)"))
    if share <= th.COMPUTE_BOUND_MAX_OVERHEAD:
        facts.extend(_top_ops(record))
        confidence = _rising(1 - share, 1 - th.COMPUTE_BOUND_MAX_OVERHEAD, 0.99)
        return Verdict("compute", confidence, tuple(facts))
    facts.append(f"between {th.COMPUTE_BOUND_MAX_OVERHEAD:.0%} and {th.LAUNCH_BOUND_OVERHEAD:.0%} of the step is "
                 "per-op overhead: both the op count and the arithmetic matter")
    return Verdict("inconclusive", 0.3, tuple(facts))


def _classify_cuda(record: RunRecord) -> Verdict:
    step = gpu_step(record)
    if step is not None:
        return _classify_gpu_step(record, step)
    utilisation = _nvml_mean_utilisation(record)
    if utilisation is None:
        return Verdict("inconclusive", 0.0, ("a CUDA run without a kernel timeline or NVML samples",))
    fact = f"NVML: the GPU ran kernels {utilisation:.0%} of the time, on average over the run (no kernel timeline)"
    if utilisation >= th.GPU_BUSY_COMPUTE:
        return Verdict("compute", 0.5, (fact,))
    if utilisation < th.GPU_BUSY_STARVED:
        return Verdict("cpu-launch", 0.4, (fact, "without a kernel timeline, host wait cannot be told from other idle"))
    return Verdict("inconclusive", 0.2, (fact,))


def _classify_gpu_step(record: RunRecord, step: GpuStep) -> Verdict:
    """A CUDA run with a kernel timeline, on its steady GPU step (``gpu_step``). Each side's headroom is what the
    step would save were it free: the kernels (the step then no shorter than the host takes to queue it) or the
    host's launches (the GPU's wait for them, less any wait for data). A GPU busy most of the step whose kernels
    hold the larger headroom is compute-bound; one idle most of it, mostly waiting for the host's launches, whose
    launches hold it is CPU-launch-bound. Between the two, the side with the larger headroom (at least
    ``SIDE_NOTABLE``; the kernels' only with the GPU busy half the step, the launches' only with the wait for them
    half the idle time) is the verdict, with less confidence and the other side named with its share; a GPU idle
    for neither reason (syncs, copies) leaves it inconclusive. Where the host takes most of a compute-bound step to queue it, that is said: a faster GPU step
    soon waits on launching."""
    if record.source is not None and (profiled := _profiler_made_wait(record, step)) is not None:
        return profiled
    kernels = record.op_profile.kernels  # type: ignore[union-attr]
    busy, length = step.busy, step.step_s
    idle = 1 - busy
    launching = launch_wait(record) or 0.0  # the host wait that is not a wait for data
    computing = step.saving(step.kernel_s)
    waited = step.launch_wait_s / length
    facts = [
        f"{gpu_busy(step)}; idle {idle:.0%}: waiting for the host {waited:.0%}, between queued kernels "
        f"{step.gap_s / length:.0%}, other {step.other_idle_s / length:.0%}",
        f"{kernels.kernels_per_step:.0f} kernels per step, {kernels.mean_kernel_s * 1e6:.1f} us each on average",
    ]
    if step.steady and abs(step.window_busy - busy) >= th.WINDOW_BUSY_APART:
        facts.append(f"in the profiled steps themselves the GPU was busy {step.window_busy:.0%} of "
                     f"{step.window_step_s * 1e3:.1f} ms a step: the profiler slows the host's launches, not the "
                     "kernels")
    if launching < waited:
        facts.append(f"of the wait for the host, {launching:.0%} of the step is launching and "
                     f"{waited - launching:.0%} waiting for data")
    if busy >= th.GPU_BUSY_COMPUTE and computing >= launching:
        facts.append(f"{kernels.tensor_core_share:.0%} of kernel time ran on Tensor Cores")
        facts.extend(_top_ops(record, device=True))
        if step.host is not None and step.host.how == "ran ahead" and \
                step.host.seconds >= th.HOST_CLOSE_BEHIND * length:
            facts.append(f"{host_pace_text(step.host)}: {step.host.seconds / length:.0%} of the step; a GPU step cut "
                         f"below {step.host.seconds * 1e3:.1f} ms waits on launching, where fewer launches (CUDA "
                         "graphs) take over")
        return Verdict("compute", _rising(busy, th.GPU_BUSY_COMPUTE, 0.95), tuple(facts))
    if busy < th.GPU_BUSY_STARVED and idle > 0 and launching / idle >= th.HOST_WAIT_DOMINANT \
            and launching >= computing:
        return Verdict("cpu-launch", _rising(launching / idle, th.HOST_WAIT_DOMINANT, 1.0), tuple(facts))
    if busy >= th.GPU_BUSY_STARVED and computing >= max(launching, th.SIDE_NOTABLE):
        facts.append(_other_side(computing, launching, busy, step.host))
        return Verdict("compute", th.MIXED_CONFIDENCE, tuple(facts))
    if launching > computing and launching >= th.SIDE_NOTABLE and launching >= th.HOST_WAIT_DOMINANT * idle:
        facts.append(_other_side(computing, launching, busy, step.host))
        return Verdict("cpu-launch", th.MIXED_CONFIDENCE, tuple(facts))
    return Verdict("inconclusive", 0.3, (
        *facts,
        f"the GPU idles {idle:.0%} of the step, mostly for neither the host's launches nor kernels queued behind "
        "each other (syncs, copies, other streams): neither busy nor starved by launching"))


def _profiler_made_wait(record: RunRecord, step: GpuStep) -> Verdict | None:
    """A trace in which every step is profiled (``gpuscope analyze``): the host's time there holds the profiler's
    own cost, about ``PROFILED_OP_COST_S`` for each op it records, which a step run without it does not pay. Where
    the GPU's wait for the host is no longer notable once that cost is taken off the host's pace, the wait is the
    profiler's, not evidence of launching: compute-bound where the kernels would then keep the GPU busy, with less
    confidence; else None (the wait stands, and the usual reading follows)."""
    ops = record.op_profile
    host = step.host.seconds if step.host is not None else step.step_s
    if ops is None or not ops.ops_per_step or step.launch_wait_s < th.SIDE_NOTABLE * step.step_s:
        return None  # no wait for the host to speak of: the usual reading
    cost = ops.ops_per_step * th.PROFILED_OP_COST_S
    device = step.kernel_s + step.gap_s + step.other_idle_s
    unprofiled = max(device, host - cost)
    waits = max(0.0, host - cost - device) / unprofiled if unprofiled > 0 else 0.0
    busy = step.kernel_s / unprofiled if unprofiled > 0 else 0.0
    if waits >= th.SIDE_NOTABLE or busy < th.GPU_BUSY_COMPUTE:
        return None
    return Verdict("compute", th.MIXED_CONFIDENCE, (
        f"{gpu_busy(step)}; it waits for the host {step.launch_wait_s / step.step_s:.0%} of it",
        f"every step of a trace is profiled: the host's {host * 1e3:.1f} ms a step holds the profiler's own cost, "
        f"about {th.PROFILED_OP_COST_S * 1e6:.0f} us for each of its {ops.ops_per_step:.0f} torch ops a step "
        f"({cost * 1e3:.1f} ms); without it the host would queue a step in about {(host - cost) * 1e3:.1f} ms, "
        f"against the {device * 1e3:.1f} ms the GPU takes to run it: the GPU would run kernels {busy:.0%} of the "
        f"step and wait for launches {waits:.0%}, too little to call it launch-bound",
        "a run under gpuscope run measures the steady steps unprofiled and tells this for certain"))


def _other_side(computing: float, launching: float, busy: float, host: HostPace | None) -> str:
    """The mixed verdict's line: the side that does not lead, with the step it would save were it free; where that
    is too little to count, why."""
    if computing >= launching:
        if launching >= th.SIDE_NOTABLE:
            return (f"partly launch-bound: the GPU waits {launching:.0%} of the step for the host's launches, while "
                    f"kernels run {busy:.0%} of it; the advice for both is ranked by its gain")
        return f"the GPU waits {launching:.0%} of the step for the host's launches: too little to bound it"
    if computing >= th.SIDE_NOTABLE:
        return (f"partly compute-bound: kernels run {busy:.0%} of the step (were they free, it would be "
                f"{computing:.0%} shorter), while the GPU waits {launching:.0%} of it for the host's launches; the "
                "advice for both is ranked by its gain")
    queue = f": the host takes {host.seconds * 1e3:.1f} ms to queue a step" if host is not None else ""
    return (f"kernels run {busy:.0%} of the step, yet were they free it would be no shorter than the host's "
            f"launches let it be{queue}")


def _top_ops(record: RunRecord, device: bool = False) -> list[str]:
    ops = record.op_profile
    if ops is None:
        return []
    # (on the host, the collectives' calls are communication, weighed apart: not the arithmetic's lead)
    top = ops.top_device if device else [o for o in ops.top_host if not is_communication_op(o.name)]
    total = (ops.device_s or sum(o.device_s for o in top)) if device else ops.mean_op_s * ops.ops - ops.comm_ops_self_s
    if not top or total <= 0:
        return []
    lead = top[0]
    seconds = lead.device_s if device else lead.self_host_s
    where = "device" if device else "op"
    return [f"{lead.name} takes {seconds / total:.0%} of {where} time ({lead.calls} calls in the profiled steps)"]


def _outside_ops(record: RunRecord) -> list[str]:
    """Where the Python profile says the steps' time went: the function with the most time of its own (a sleep, a
    lock's wait under ``queue.Queue.get``), and the functions it was called under, by cumulative time. torch's own
    calls into its ops (``run_backward``, ``torch._C._nn.linear``) are passed over: their time is the ops' own, which
    the trace timed, and the time sought is outside them (an RL loop's distribution checks and environment)."""
    profile = record.python_profile
    profiled_s = profile.total_s - profile.startup_s if profile is not None else 0.0
    outside = [f for f in profile.top_own if not _torch_call(f)] if profile is not None else []
    if profile is None or not outside or profiled_s <= 0:
        return []
    lead = outside[0]
    window = profile.window
    steps = "the whole run" if profile.whole_run else f"steps {window.first_step}-{window.last_step}"
    where = f" ({lead.file}:{lead.line})" if lead.file != "~" else ""
    fact = (f"the Python profile ({steps}) spends {_seconds(lead.own_s)} of its {_seconds(profiled_s)} "
            f"({lead.own_s / profiled_s:.0%}) in {lead.function}{where}")
    # (a function whose time is mostly one torch call's wraps that call: autograd's backward over run_backward)
    wrapped = [f.own_s for f in profile.top_own if _torch_call(f)]
    callers = [f"{f.function} ({f.file}:{f.line})" for f in profile.top_cumulative
               if f.file != "~" and f.cumulative_s >= th.OPS_COVER_CALLER * lead.own_s
               and not any(th.OPS_COVER_CALLER * f.cumulative_s <= own <= f.cumulative_s for own in wrapped)
               and (f.file, f.line, f.function) != (lead.file, lead.line, lead.function)][:th.OPS_COVER_CALLERS]
    return [f"{fact}, under {', '.join(callers)}" if callers else fact]


def _seconds(value: float) -> str:
    """``2.00 s``; under a tenth of a second in milliseconds (``3.4 ms``, where ``0.00 s`` would say nothing)."""
    return f"{value:.2f} s" if value >= 0.1 else f"{value * 1e3:.1f} ms"


def _torch_call(function: FunctionStat) -> bool:
    """A built-in of torch's in the Python profile (``<built-in method torch.multinomial>``, ``<method 'run_backward'
    of 'torch._C._EngineBase' objects>``): a call into its ops."""
    return function.file == "~" and "torch" in function.function


def queue_wait_text(site: CallSite, loader: bool) -> str:
    """Where a loop fed through a queue waited for its batches (``steps.queue_waits``), and what would shorten it."""
    fed = ("a thread taking the loader's batches hands them over" if loader else
           "a thread or process of the script's own hands the batches over, no DataLoader")
    return (f"the wait is at {site.file}:{site.line} `{site.code}`, on a queue: {fed}; they come slower than the "
            "steps use them: build them cheaper, or several at once in a DataLoader's worker processes where cores "
            "are spare (threads building them in Python share one interpreter lock)")


def _waiting_iterator(record: RunRecord, outside: str, facts: list[str]) -> Verdict | None:
    """Data-loading, where the loop waits on an iterator of its own (``iterator_wait``)."""
    if (wait := iterator_wait(record)) is None:
        return None
    return Verdict("data-loading", _rising(wait.share, th.DATA_WAIT_BOUND, 0.5), (
        f"the loop waits for its batches: the Python profile's steps ({wait.steps}) spend {wait.share:.0%} of their "
        f"time waiting on a lock under {wait.feeder.function} ({wait.feeder.file}:{wait.feeder.line}), an iterator "
        "of the script's own fed by a thread or process (a queue's get), which gpuscope cannot time as it times a "
        "DataLoader's wait: the batches come slower than the steps use them; build them cheaper, or several at once "
        "in a DataLoader's worker processes where cores are spare (threads building them in Python share one "
        "interpreter lock)", outside, *facts))


def _nvml_mean_utilisation(record: RunRecord) -> float | None:
    if record.gpus is None:
        return None
    values = [u for device in record.gpus.devices for u in device.sm_util]
    return sum(values) / len(values) if values else None


def _rising(value: float, threshold: float, sure_at: float) -> float:
    """Confidence 0.6 at the threshold, rising linearly to 0.95 at ``sure_at`` and beyond."""
    if sure_at <= threshold:
        return 0.95
    return round(min(0.95, 0.6 + 0.35 * (value - threshold) / (sure_at - threshold)), 2)
