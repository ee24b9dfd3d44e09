"""Turning hook events into timed steps, in bounded memory. Pure Python (no torch), tested without a GPU.

- ``PhaseClock`` charges host time to the innermost open phase (data wait, forward, backward, optimizer): nested
  phases (a closure's forward inside ``optimizer.step``) count once, and the phases plus "other" add up to the
  step's wall time. "other" opened inside a phase (the rest of an optimizer's closure) is no part of that phase.
- ``StepLog`` keeps the first steps one by one and a uniform sample of the rest (a million steps: a few thousand).
- ``DeviceTimeline`` resolves device-side markers (CUDA events) once the device has passed them, never waiting
  for it, and splits the device's timeline by the host phase that queued each interval.
- ``StepTracker`` ties them together: it decides where steps begin and end.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from gpuscope.collect.captures import StepRecord
from gpuscope.collect.steps.device_timeline import DeviceTimeline, phased
from gpuscope.collect.steps.phase_clock import PhaseClock
from gpuscope.collect.steps.step_listeners import Listener, ListenerSchedule

STEP_HEAD = 64
"""Steps kept one by one from the start of the run (warm-up is decided among them)."""
STEP_CAPACITY = 4096
"""Further steps kept as a uniform sample of at most this many records (about 1 MB of memory)."""

LOSS_CAPACITY = 2048
"""Losses kept at most (``LossLog``): a few tens of kilobytes of scalar tensors on the device where they are (floats
for a CPU run's)."""

SOURCE_PRIORITY = {"explicit": 3, "optimizer": 2, "dataloader": 1, "backward": 0}
"""Which kind of marker defines steps when several are seen: explicit marks, then optimizer steps, DataLoader
batches, ``backward()`` calls (a loop updating its parameters by hand on batches sliced from a tensor)."""
ABOVE_DATALOADER = frozenset(source for source, rank in SOURCE_PRIORITY.items() if rank > SOURCE_PRIORITY["dataloader"])
"""The kinds of marker under which DataLoader batches mark no step."""


class StepLog:
    """The first ``head`` steps one by one, then a uniform random sample of at most ``capacity`` later steps
    (reservoir sampling, seeded, so runs are reproducible): memory stays bounded however long the run. A random
    sample rather than every k-th step: loops are often periodic (gradient accumulation, a slow batch every N), and
    a fixed stride can land on one phase of the period only. The first ``skip`` steps (``--skip-steps``) are
    counted and not kept: the head begins after them.

    Once the sample is full, the next step to keep is drawn ahead (Li's algorithm L: a geometric jump), so a step
    left out costs one comparison: no random number a step, as the textbook reservoir draws.
    """

    def __init__(self, head: int = STEP_HEAD, capacity: int = STEP_CAPACITY, seed: int = 0x5EED,
                 skip: int = 0) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.skip = skip
        self.head_size = head
        self.capacity = capacity
        self._seed = seed
        self.clear()

    def add(self, wall_s: float, phases_s: dict[str, float], profiled: bool = False,
            evaluated: bool = False) -> None:
        """Count one step, and keep it if it is to be kept. (A row, a tuple, is kept rather than a ``StepRecord``:
        building one is a Python call, a few microseconds a step once the step's own work has evicted gpuscope from
        the CPU's caches; ``find`` and ``records`` make the records, once each.)"""
        index = self.count
        self.count = index + 1
        if index < self._next_kept:  # a skipped step, or one the full sample leaves out
            return
        row = (index, wall_s, phases_s, profiled, evaluated)
        if index < self._body_start:
            self._head.append(row)
            self._next_kept = index + 1
            return
        body = self._body
        if len(body) < self.capacity:
            body.append(row)
            self._next_kept = index + 1
            if len(body) == self.capacity:
                self._weight = self._shrink(1.0)
                self._jump(index)
            return
        if self._by_index is None:  # the first replacement: from now on rows are found by their index
            self._by_index = {kept[0]: kept for kept in body}
        slot = self._rng.randrange(self.capacity)
        evicted = body[slot][0]
        del self._by_index[evicted]
        self._made.pop(evicted, None)
        body[slot] = self._by_index[index] = row
        self._weight = self._shrink(self._weight)
        self._jump(index)

    def extend_last(self, wall_s: float, phases_s: dict[str, float], profiled: bool = False) -> None:
        """Add ``wall_s`` and ``phases_s`` to the last step counted, where it was kept (a step found to end later
        than where it was closed: ``StepTracker``'s anchor moving to the optimizer that steps last)."""
        index = self.count - 1
        rows = self._head if self._head and self._head[-1][0] == index else self._body
        if not rows or rows[-1][0] != index:  # not kept, or the sample's rows are no longer in step order
            return
        _, wall, phases, was_profiled, evaluated = rows[-1]
        phases = {phase: phases.get(phase, 0.0) + phases_s.get(phase, 0.0) for phase in {*phases, *phases_s}}
        rows[-1] = (index, wall + wall_s, phases, was_profiled or profiled, evaluated)
        if self._by_index is not None:
            self._by_index[index] = rows[-1]
        self._made.pop(index, None)

    def _shrink(self, weight: float) -> float:
        """Algorithm L's weight times the largest of ``capacity`` uniform draws."""
        return weight * math.exp(math.log(self._uniform()) / self.capacity)

    def _jump(self, index: int) -> None:
        """Draw the next step to keep after ``index``: each later step is kept with the right chance (capacity over
        the steps seen), the jumps between kept ones drawn at once."""
        weight = self._weight
        gap = math.floor(math.log(self._uniform()) / math.log1p(-weight)) if weight < 1.0 else 0
        self._next_kept = index + 1 + gap

    def _uniform(self) -> float:
        """A uniform draw in (0, 1): never 0, whose logarithm there is not."""
        while True:
            value = self._rng.random()
            if value > 0.0:
                return value

    @property
    def body_weight(self) -> float:
        """How many steps of the run each kept later step stands for (1.0 until sampling starts)."""
        later = self.count - self._body_start
        return later / len(self._body) if self._body else 1.0

    def find(self, index: int) -> StepRecord | None:
        """The kept record of step ``index``, if it was kept (the same record each time: changes to it hold)."""
        if self.skip <= index < self.skip + len(self._head):
            return self._record(self._head[index - self.skip])
        if self._by_index is not None:
            row = self._by_index.get(index)
        else:  # the body is every step from its start, in order
            position = index - self._body_start
            row = self._body[position] if 0 <= position < len(self._body) else None
        return self._record(row) if row is not None else None

    def records(self) -> list[StepRecord]:
        """The kept records, in step order."""
        return [self._record(row) for row in (*self._head, *sorted(self._body, key=lambda row: row[0]))]

    def _record(self, row: tuple[int, float, dict[str, float], bool, bool]) -> StepRecord:
        """The record of a kept row, made on first asking."""
        made = self._made.get(row[0])
        if made is None:
            index, wall_s, phases_s, profiled, evaluated = row
            made = self._made[index] = StepRecord(index, wall_s, phases_s, profiled, evaluated=evaluated)
        return made

    def clear(self) -> None:
        """Forget every step (their losses are the caller's: ``LossLog.restart``)."""
        self.count = 0
        self._head: list[tuple[int, float, dict[str, float], bool, bool]] = []
        self._body: list[tuple[int, float, dict[str, float], bool, bool]] = []
        self._body_start = self.skip + self.head_size  # the index of the first step the sample may keep
        self._next_kept = self.skip  # the next step kept: every one from the skipped ones' end, until the sample
        # is full; then one drawn ahead (_jump)
        self._weight = 1.0
        self._by_index: dict[int, tuple[int, float, dict[str, float], bool, bool]] | None = None  # the sample's
        # rows by step index, once it replaces some (until then a row's place in it says its index)
        self._made: dict[int, StepRecord] = {}  # the records made of kept rows, by step index
        self._rng = random.Random(self._seed)
        if not hasattr(self, "losses"):
            self.losses = LossLog()


class LossLog:
    """The loss of each step, as the tensor its backward() was called on: kept, not read, so that the loop never
    waits for the device; read once the run is over (a CPU loss is kept as its value, read at once: no device to wait
    for, and no small tensor left among the step's large blocks). Every step's until ``capacity`` entries are held,
    then every 2nd step's, every 4th... (the stride doubles each time it fills): bounded, spread evenly over the run."""

    def __init__(self, capacity: int = LOSS_CAPACITY) -> None:
        self.capacity = capacity
        self.entries: list[tuple[int, object, bool]] = []
        self.stride = 1

    def add(self, step: int, loss: object, by_grad: bool = False) -> None:
        """Keep ``loss`` (a detached one-element tensor) as step ``step``'s, if that step is kept. ``by_grad``: it
        was ``autograd.grad``'s, not ``backward()``'s (a step's loss only where it called no ``backward()``)."""
        if step % self.stride:
            return
        if len(self.entries) >= self.capacity:
            self.stride *= 2
            self.entries = [entry for entry in self.entries if entry[0] % self.stride == 0]
            if step % self.stride or len(self.entries) >= self.capacity:  # (one step's many: an LBFGS closure's)
                return
        self.entries.append((step, loss, by_grad))

    def restart(self, merged: bool) -> None:
        """The steps were counted again from 0 (a marker of a higher kind appeared): with ``merged``, everything so
        far is the new first step (``StepTracker._takes``), and so are its losses; else they belong to no step."""
        self.entries = [(0, loss, by_grad) for _, loss, by_grad in self.entries] if merged else []
        self.stride = 1


class StepTracker:
    """Decides where steps begin and end, from three kinds of marker, and times their phases.

    - ``explicit`` (``gpuscope.step()``) and ``optimizer`` (``optimizer.step()`` ended) each end a step and
      begin the next; the first step begins when tracking starts.
    - ``dataloader``: a step begins at a ``__next__`` that delivers a batch and ends at the next ``__next__``;
      used only for loops that never step an optimizer (inference).
    - ``backward``: a step ends and the next begins as each top-level ``backward()`` returns; used only for loops
      with none of the above (parameters updated by hand, batches sliced from a tensor). The first ``backward()``'s
      end is held as a possible boundary, and taken only if a second one ends with no other marker in between (an
      optimizer usually steps right after the first): then the loop's steps equal its iterations.
    The highest-priority kind seen defines the steps; when a higher one first appears, steps counted by a lower
    one are dropped (counted by a coarser marker) and counting restarts. ``on_span_end`` hears whether each span
    held an evaluation pass as it ends, counted as a step or not (between epochs, the run's end).

    Profilers open *windows* (``window_opened`` / ``window_closed``); a step during any part of which a window
    was open is marked ``profiled``. ``listeners`` are called with the index of each step as it begins (under the
    ``backward`` kind from the third step on: the second had run by the time backward was known to define steps),
    each at the steps it asks for (``step_listeners``).
    """

    def __init__(self, now: float, log: StepLog | None = None, clock: Callable[[], float] | None = None) -> None:
        self.log = log if log is not None else StepLog()
        self._clock = clock  # times the listeners, whose work is gpuscope's and kept out of the step
        self.clock = PhaseClock(now)
        self.source: str | None = None
        self.dropped = 0  # steps dropped when a higher-priority marker appeared
        self.device: DeviceTimeline | None = None
        self.passes = [0, 0]  # forwards of the timed (root) modules, backward() calls once forwards are timed
        self._t0 = now
        self._open_t: float | None = now
        self._anchor_optimizer: int | None = None
        self._others_stepped: set[int] = set()  # other optimizers stepped since the anchor last did
        self._batches = 0  # batches requested so far (under any kind of step)
        self._last_other: tuple[int, int] | None = None  # the last other optimizer stepped since the anchor did,
        # and the batches requested by then
        self._ended_by: int | None = None  # the other optimizer after which the anchor's last cycle took a batch
        self._held_other: tuple[float, dict[str, float], bool] | None = None  # the phases split at its step
        self._held: tuple[float, dict[str, float]] | None = None  # the first backward's end, and the phases to it
        self._windows = 0
        self._profiled = False
        self._evaluated = False  # the trained model ran forward in eval mode / without gradients
        self.final_evaluation_s = 0.0  # see finish()
        self.on_span_end: Callable[[bool], None] | None = None
        self.schedule = ListenerSchedule()
        self.phase_listeners: list[Callable[[str], None]] = []  # called with the phase now charged
        self.hold: Callable[[StepTracker], bool] | None = None  # keeps a provisional step from the listeners

    # -- phases ------------------------------------------------------------------------------------------
    def enter(self, phase: str, now: float) -> None:
        """A timed phase begins."""
        if self.clock.enter(phase, now):
            if phase == "forward" or (phase == "backward" and self.passes[0]):  # not nested in another
                self.passes[phase == "backward"] += 1
            if self.device is not None or self.phase_listeners:  # else a CPU run: no one to tell (the hot path)
                self._phase_changed()

    def exit(self, phase: str, now: float) -> None:
        """A timed phase ends."""
        if self.clock.exit(phase, now) and (self.device is not None or self.phase_listeners):
            self._phase_changed()

    def _phase_changed(self) -> None:
        phase = self.clock.current
        if self.device is not None:
            self.device.mark_phase(self._device_step(), phase)
        for listener in self.phase_listeners:
            listener(phase)

    def evaluation_forward(self) -> None:
        """The trained model's forward began in eval mode or with gradients off (an evaluation pass): so marked."""
        self._evaluated = True

    # -- profiling windows -------------------------------------------------------------------------------
    def window_opened(self) -> None:
        """A profiler started: the current step, and every step until it stops, is profiled."""
        self._windows += 1
        self._profiled = True

    def window_closed(self) -> None:  # a profiler stopped
        self._windows = max(0, self._windows - 1)

    @property
    def in_window(self) -> bool:
        """Whether one of gpuscope's profilers is running now."""
        return self._windows > 0

    # -- markers -----------------------------------------------------------------------------------------
    @property
    def anchor_optimizer(self) -> int | None:
        """The id of the optimizer ending the steps (None before one stepped)."""
        return self._anchor_optimizer

    def optimizer_stepped(self, optimizer_id: int, now: float, replaces: bool = False) -> bool:
        """``optimizer.step()`` returned. With several optimizers, one ends the step (the *anchor*): the first one
        stepped, until another steps twice with no step of it in between (a later phase of the script trains another
        model; a GAN's generator steps once between two of its discriminator's). Where, two cycles running, another
        was the last to step before the next batch was asked for (a GAN's generator; a second optimizer over other
        parameters of one model), the iteration ends with it, and so do the steps from then on: the last step is
        extended to that one's step (``_move_anchor``). True where the anchor has just changed
        (``anchor_optimizer``). ``replaces``: this one replaces the anchor at once (``OptimizerWatch.replaces_anchor``:
        that one was freed, or this one was built again over its parameters), even where its id is the freed one's."""
        if replaces:
            self._anchor_optimizer = None
            self._others_stepped.clear()
            self._ended_by = None
        anchor = self._anchor_optimizer
        if anchor is not None and optimizer_id != anchor:
            if optimizer_id not in self._others_stepped:
                self._others_stepped.add(optimizer_id)
                self._other_stepped(optimizer_id, now)
                return False
        elif anchor is not None:  # the anchor again: which other, if any, ended the cycle before a batch
            last = self._last_other
            ended = last[0] if last is not None and self._batches > last[1] else None
            if ended is not None and ended == self._ended_by and self._held_other is not None:
                self._move_anchor(ended, optimizer_id)
                return True
            self._ended_by = ended
        self._release_held()
        self._last_other = None
        changed, self._anchor_optimizer = optimizer_id != anchor, optimizer_id
        if changed:  # (the cycles seen were another anchor's)
            self._ended_by = None
        self._others_stepped.clear()
        self._boundary("optimizer", now)
        return changed

    def _other_stepped(self, optimizer_id: int, now: float) -> None:
        """An optimizer other than the anchor stepped: where the anchor's last cycle ended with it, the phases are
        split here, for the step to end here if this cycle does too."""
        self._last_other = (optimizer_id, self._batches)
        self._release_held()
        if optimizer_id == self._ended_by and self.source == "optimizer":
            self._held_other = (now, self.clock.split(now), self._profiled)

    def _release_held(self) -> None:
        """The phases split at another optimizer's step go back to the open step (it ended no step)."""
        if self._held_other is not None:
            for phase, seconds in self._held_other[1].items():
                self.clock.totals[phase] += seconds
            self._held_other = None

    def _move_anchor(self, optimizer_id: int, stepping: int) -> None:
        """``optimizer_id`` ends the steps from now (``stepping``, the anchor until now, has just stepped): the open
        step's time up to its last step (held) goes to the step before, and the open step begins there. The
        device's markers start again at the next step."""
        held_t, held_phases, held_profiled = self._held_other  # type: ignore[misc]
        self._held_other = None
        if self._open_t is not None:
            self.log.extend_last(max(0.0, held_t - self._open_t), held_phases, held_profiled)
        self._open_t = held_t
        self._anchor_optimizer, self._ended_by = optimizer_id, None
        self._others_stepped = {stepping}
        self._last_other = (stepping, self._batches)
        if self.device is not None:
            self.device.reset()
            self.device.mark(None, self.clock.current)

    def backward_ended(self, now: float) -> None:
        """A top-level ``backward()`` (or ``autograd.grad``) returned: under the ``backward`` kind, a step ends."""
        if self.source == "backward":
            self._boundary("backward", now)
        elif self.source is None and self._held is None:
            self._held = (now, self.clock.split(now))
        elif self.source is None:  # a second backward and no other marker: backward defines the steps
            held_t, held_phases = self._held  # type: ignore[misc]
            self._held = None
            self._takes("backward")
            self.log.add(held_t - self._t0, held_phases, self._profiled, self._evaluated)
            self._end_span()
            self._open_t = held_t
            # the step that began at the first backward's end has run already: the listeners hear of the next
            # one only (told of both now, a listener hooking modules at one would find at the other that their
            # forward never ran)
            self._boundary("backward", now)

    def explicit(self, now: float) -> None:
        """``gpuscope.step()`` was called."""
        self._boundary("explicit", now)

    def batch_requested(self, now: float) -> None:
        """A DataLoader iterator's ``__next__`` was called: under the ``dataloader`` kind, a step ends and the
        next begins (cancelled by ``batch_exhausted`` if no batch comes)."""
        # (a count and a set lookup first: under an optimizer's steps, every batch's case, that is all)
        self._batches += 1
        if self.source in ABOVE_DATALOADER or not self._takes("dataloader"):
            return
        if self._open_t is not None:
            self._close_step(now)
        else:
            self.clock.split(now)  # time between epochs belongs to no step
            self._end_span()
        self._open_t = now
        if self.device is not None:
            self.device.mark(self.log.count, self.clock.current)
        self._notify()

    def batch_exhausted(self, now: float) -> None:
        """That ``__next__`` raised StopIteration: no step began."""
        if self.source == "dataloader":
            self._open_t = None
            self.clock.split(now)
            if self.device is not None:
                self.device.mark(None, self.clock.current)

    def attach_device(self, timeline: DeviceTimeline) -> None:
        """Start device timing from now; the first step it times completely is the next one."""
        self.device = timeline
        timeline.mark(self._device_step(), self.clock.current)

    def discount(self, start: float, end: float) -> None:
        """Keep time gpuscope spent on itself, from ``start`` to ``end``, out of the open step and its phases."""
        spent = end - start
        if spent <= 0:
            return
        if self._open_t is not None:
            self._open_t += spent
        self.clock.skip(spent)

    def finish(self, now: float | None = None) -> None:
        """End of tracking: resolve outstanding device markers. The open span (after the last marker) is no step;
        where it held an evaluation pass (a test pass after training), its time to ``now`` is final_evaluation_s."""
        if self._evaluated and now is not None and self._open_t is not None:
            self.final_evaluation_s = now - self._open_t
        self._end_span()
        if self.device is not None:
            self._attach_device_times(self.device.drain())

    def _end_span(self) -> None:
        """The open span ended (a step counted or not): ``on_span_end`` is told how, and its marks are reset."""
        if self.on_span_end is not None:
            self.on_span_end(self._evaluated)
        self._profiled, self._evaluated = self._windows > 0, False

    # -- internals ---------------------------------------------------------------------------------------
    def _takes(self, source: str) -> bool:
        """Whether markers of ``source`` define steps, switching to it if it outranks the current kind."""
        current = self.source
        if current == source:
            return True
        if current is not None and SOURCE_PRIORITY[source] < SOURCE_PRIORITY[current]:
            return False
        self.dropped += self.log.count
        self.log.clear()
        self._release_held()
        self.log.losses.restart(merged=source != "dataloader")
        if self._held is not None:  # the first backward's end was no boundary after all
            for phase, seconds in self._held[1].items():
                self.clock.totals[phase] += seconds
            self._held = None
        self.source = source
        self._open_t = self._t0 if source != "dataloader" else None
        if self.device is not None:
            self.device.reset()
        return True

    def _boundary(self, source: str, now: float) -> None:
        if source != self.source and not self._takes(source):
            return
        if self._open_t is not None:
            self._close_step(now)
        self._open_t = now
        if self.device is not None:
            self.device.mark(self.log.count, self.clock.current)
        self._notify()

    def _close_step(self, now: float) -> None:
        wall = now - self._open_t  # type: ignore[operator]
        phases = self.clock.split(now)
        self.log.add(wall, phases, self._profiled, self._evaluated)
        self._end_span()
        if self.device is not None:
            self._attach_device_times(self.device.poll())

    @property
    def listeners(self) -> list[Listener]:
        """The step listeners, in the order they are told."""
        return self.schedule.listeners

    def _notify(self) -> None:
        schedule = self.schedule  # (whether any listener is due, written out: this runs at every step's beginning)
        if schedule.boundaries < schedule.next_due or not schedule.listeners or \
                (self.hold is not None and self.hold(self)):
            schedule.boundaries += 1
            return
        started = self._clock() if self._clock is not None else 0.0
        schedule.tell(self.log.count)
        if self._clock is not None:
            self.discount(started, self._clock())
        # a window opened or closed by a listener did so exactly at this step's start
        self._profiled = self._windows > 0

    def _device_step(self) -> int | None:
        return self.log.count if self._open_t is not None else None

    def _attach_device_times(self, done: list[tuple[int, dict[str, float]]]) -> None:
        for index, phases in done:
            record = self.log.find(index)
            if record is not None:
                record.device_phases_s = phases if phased(index) else None
                record.device_wall_s = sum(phases.values())
