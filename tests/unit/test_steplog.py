"""Turning hook events into steps: exclusive phase time, bounded logs, step sources, device-side timing."""

from __future__ import annotations

import pytest

from gpuscope.collect.steps.steplog import DeviceTimeline, PhaseClock, StepLog, StepTracker


class TestPhaseClock:
    def test_time_goes_to_the_innermost_open_phase(self) -> None:
        # given an optimizer step whose closure runs a forward pass
        clock = PhaseClock(now=0.0)
        clock.enter("optimizer", 1.0)
        clock.enter("forward", 2.0)
        clock.exit("forward", 5.0)
        clock.exit("optimizer", 6.0)
        # when the step is split off at 10 s
        totals = clock.split(10.0)
        # then forward has its 3 s, the optimizer only its own 2 s, and nothing is counted twice
        assert totals == {"data_wait": 0.0, "forward": 3.0, "backward": 0.0, "optimizer": 2.0}

    def test_reentering_the_open_phase_deepens_it_without_a_transition(self) -> None:
        clock = PhaseClock(now=0.0)
        assert clock.enter("forward", 0.0) is True
        assert clock.enter("forward", 1.0) is False  # a root module called inside another
        assert clock.exit("forward", 2.0) is False
        assert clock.current == "forward"
        assert clock.exit("forward", 3.0) is True
        assert clock.current == "other"
        assert clock.split(3.0)["forward"] == 3.0

    def test_closing_an_outer_phase_unwinds_inner_phases_an_exception_left_open(self) -> None:
        clock = PhaseClock(now=0.0)
        clock.enter("backward", 0.0)
        clock.enter("forward", 1.0)  # its exit hook never ran
        clock.exit("backward", 4.0)
        assert clock.current == "other"
        assert clock.split(4.0) == {"data_wait": 0.0, "forward": 3.0, "backward": 1.0, "optimizer": 0.0}

    def test_closing_a_phase_left_open_inside_a_deeper_one_keeps_the_outer_one_open(self) -> None:
        clock = PhaseClock(now=0.0)
        clock.enter("backward", 0.0)
        clock.enter("backward", 1.0)  # backward() inside backward(): a gradient penalty
        clock.enter("forward", 2.0)
        # the inner backward closes: the forward an exception left open is unwound, the outer backward goes on
        assert clock.exit("backward", 3.0) is True
        assert clock.current == "backward"
        assert clock.exit("backward", 5.0) is True
        assert clock.split(5.0) == {"data_wait": 0.0, "forward": 1.0, "backward": 4.0, "optimizer": 0.0}

    def test_an_other_frame_charges_no_phase_and_ends_the_one_around_it_for_its_time(self) -> None:
        # given an optimizer step whose closure (an "other" frame) runs a forward pass
        clock = PhaseClock(now=0.0)
        clock.enter("optimizer", 0.0)
        assert clock.enter("other", 1.0) is True
        clock.enter("forward", 2.0)
        clock.exit("forward", 3.0)
        assert clock.current == "other"
        clock.exit("other", 4.0)
        clock.exit("optimizer", 6.0)
        # then the optimizer has its own 3 s, the forward 1 s, and the closure's remaining 2 s go to no phase
        assert clock.split(6.0) == {"data_wait": 0.0, "forward": 1.0, "backward": 0.0, "optimizer": 3.0}

    def test_a_phase_entered_again_below_another_is_a_frame_of_its_own(self) -> None:
        clock = PhaseClock(now=0.0)
        clock.enter("forward", 0.0)
        clock.enter("data_wait", 1.0)  # a model that loads inside its forward
        clock.enter("forward", 2.0)  # and runs a submodule timed as a root in there
        assert clock.exit("forward", 3.0) is True
        assert clock.current == "data_wait"
        clock.exit("data_wait", 4.0)
        assert clock.current == "forward"
        clock.exit("forward", 5.0)
        assert clock.split(5.0) == {"data_wait": 2.0, "forward": 3.0, "backward": 0.0, "optimizer": 0.0}

    def test_closing_a_phase_that_is_not_open_changes_nothing(self) -> None:
        clock = PhaseClock(now=0.0)
        assert clock.exit("forward", 1.0) is False
        clock.enter("backward", 1.0)
        assert clock.exit("optimizer", 2.0) is False
        assert clock.current == "backward"
        clock.skip(0.5)  # gpuscope's own half second, kept out
        assert clock.split(3.0) == {"data_wait": 0.0, "forward": 0.0, "backward": 1.5, "optimizer": 0.0}
        assert clock.current == "backward"  # a split leaves the open phases open

    def test_split_charges_the_open_phase_up_to_the_split(self) -> None:
        clock = PhaseClock(now=0.0)
        clock.enter("data_wait", 1.0)
        assert clock.split(3.0)["data_wait"] == 2.0
        assert clock.split(4.0)["data_wait"] == 1.0


class TestStepLog:
    def test_memory_stays_bounded_over_a_long_run(self) -> None:
        log = StepLog(head=8, capacity=64)
        for i in range(100_000):
            log.add(0.01, {})
        assert log.count == 100_000
        assert len(log.records()) == 8 + 64
        assert log.body_weight == pytest.approx((100_000 - 8) / 64)

    def test_kept_steps_are_the_head_then_a_sample_spread_over_the_whole_run(self) -> None:
        log = StepLog(head=4, capacity=50)
        for i in range(10_000):
            log.add(float(i), {})
        indices = [r.index for r in log.records()]
        assert indices[:4] == [0, 1, 2, 3]
        assert indices == sorted(indices)
        later = indices[4:]
        assert min(later) < 2_500 and max(later) > 7_500
        assert all(log.find(i) is not None and log.find(i).index == i for i in indices)
        assert sum(log.find(i) is not None for i in range(4, 10_000)) == 50

    def test_every_later_step_is_as_likely_to_be_kept_as_any_other(self) -> None:
        # given: 300 runs of 5,000 steps, each keeping a sample of 50 (a different seed each)
        kept_per_tenth = [0] * 10
        for seed in range(300):
            log = StepLog(head=0, capacity=50, seed=seed)
            for _ in range(5_000):
                log.add(1.0, {})
            for record in log.records():
                kept_per_tenth[record.index * 10 // 5_000] += 1
        # then: each tenth of the run holds a tenth of the kept steps (1,500 of 15,000; one standard deviation is
        # about 37), the first steps after the sample filled no less than the last ones
        assert all(1_350 < kept < 1_650 for kept in kept_per_tenth), kept_per_tenth

    def test_a_kept_step_is_found_by_its_index_before_and_after_the_sample_fills(self) -> None:
        log = StepLog(head=2, capacity=4, skip=1)
        for i in range(6):
            log.add(float(i), {})
        # the skipped step, then the head, then the sample while it fills: every one found
        assert log.find(0) is None and [log.find(i).wall_s for i in range(1, 6)] == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert log.find(6) is None
        for i in range(6, 1_000):
            log.add(float(i), {})
        kept = [r.index for r in log.records()]
        assert len(kept) == 2 + 4 and all(log.find(i).wall_s == float(i) for i in kept)
        assert sum(log.find(i) is not None for i in range(1_000)) == 6

    def test_the_last_step_extended_keeps_its_index_and_adds_the_time(self) -> None:
        log = StepLog(head=4, capacity=8)
        log.add(1.0, {"forward": 0.5, "backward": 0.0}, profiled=False)
        log.extend_last(0.5, {"backward": 0.25}, profiled=True)
        [record] = log.records()
        assert (record.index, record.wall_s, record.profiled) == (0, 1.5, True)
        assert record.phases_s == {"forward": 0.5, "backward": 0.25}

    def test_the_sample_is_the_same_on_every_run(self) -> None:
        def kept() -> list[int]:
            log = StepLog(head=2, capacity=10)
            for _ in range(1_000):
                log.add(1.0, {})
            return [r.index for r in log.records()]

        assert kept() == kept()


class FakeEvent:
    """A device marker whose completion and time the test controls (times in ms, like torch.cuda.Event)."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.at: float | None = None

    def record(self) -> None:
        self.device.queue.append(self)

    def query(self) -> bool:
        return self.at is not None

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        return end.at - self.at

    def synchronize(self) -> None:
        self.device.run_until_idle()


class FakeDevice:
    """Markers are reached in order at the times the test gives."""

    def __init__(self) -> None:
        self.queue: list[FakeEvent] = []
        self.passed = 0
        self.syncs = 0

    def reach(self, *times_ms: float) -> None:
        for t in times_ms:
            self.queue[self.passed].at = t
            self.passed += 1

    def run_until_idle(self) -> None:
        self.syncs += 1
        last = max((e.at for e in self.queue if e.at is not None), default=0.0)
        while self.passed < len(self.queue):
            last += 1.0
            self.reach(last)

    def timeline(self) -> DeviceTimeline:
        return DeviceTimeline(lambda: FakeEvent(self))


class TestDeviceTimeline:
    def test_intervals_are_charged_to_the_step_and_phase_that_queued_them(self) -> None:
        # given markers: step 0 forward, step 0 backward, step 1 starts
        device = FakeDevice()
        timeline = device.timeline()
        timeline.mark(0, "forward")
        timeline.mark(0, "backward")
        timeline.mark(1, "other")
        # when the device has passed all three
        device.reach(0.0, 30.0, 100.0)
        done = timeline.poll()
        # then step 0 had 30 ms of forward and 70 ms of backward on the device
        assert done == [(0, pytest.approx({"forward": 0.030, "backward": 0.070}))]

    def test_polling_never_waits_for_markers_the_device_has_not_reached(self) -> None:
        device = FakeDevice()
        timeline = device.timeline()
        timeline.mark(0, "forward")
        timeline.mark(1, "forward")
        device.reach(0.0)
        assert timeline.poll() == []
        assert device.syncs == 0
        device.reach(12.0)
        assert timeline.poll() == [(0, pytest.approx({"forward": 0.012}))]

    def test_drain_waits_once_and_drops_the_unfinished_last_step(self) -> None:
        device = FakeDevice()
        timeline = device.timeline()
        timeline.mark(0, "forward")
        timeline.mark(1, "forward")  # step 1 never ends
        done = timeline.drain()
        assert device.syncs == 1
        assert [step for step, _ in done] == [0]

    def test_markers_are_reused_once_resolved(self) -> None:
        device = FakeDevice()
        made = []

        def make() -> FakeEvent:
            made.append(FakeEvent(device))
            return made[-1]

        timeline = DeviceTimeline(make)
        for step in range(50):
            timeline.mark(step, "forward")
            device.reach(float(step))
            timeline.poll()
        assert len(made) <= 3

    def test_a_device_that_never_progresses_stops_the_timing_instead_of_growing(self) -> None:
        device = FakeDevice()
        timeline = device.timeline()
        for step in range(DeviceTimeline.MAX_PENDING + 10):
            timeline.mark(step, "forward")
        assert timeline.gave_up
        assert len(device.queue) == DeviceTimeline.MAX_PENDING


    def test_no_marker_is_recorded_while_marking_is_not_allowed(self) -> None:
        device = FakeDevice()
        capturing = True
        timeline = DeviceTimeline(lambda: FakeEvent(device), can_mark=lambda: not capturing)
        timeline.mark(0, "forward")  # inside a CUDA graph capture
        capturing = False
        timeline.mark(0, "backward")
        assert len(device.queue) == 1
        assert not timeline.gave_up

    def test_a_marker_that_fails_stops_device_timing_without_raising(self) -> None:
        class Broken(FakeEvent):
            def record(self) -> None:
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

        timeline = DeviceTimeline(lambda: Broken(FakeDevice()))
        timeline.mark(0, "forward")
        timeline.mark(1, "forward")
        assert timeline.gave_up
        assert timeline.poll() == [] and timeline.drain() == []


class TestStepTracker:
    def test_optimizer_steps_end_steps_and_phases_add_up_to_the_wall_time(self) -> None:
        tracker = StepTracker(now=0.0)
        t = 0.0
        for _ in range(3):
            tracker.enter("data_wait", t)
            tracker.exit("data_wait", t + 0.5)
            tracker.enter("forward", t + 0.5)
            tracker.exit("forward", t + 0.7)
            tracker.enter("backward", t + 0.8)
            tracker.exit("backward", t + 0.9)
            tracker.enter("optimizer", t + 0.9)
            tracker.exit("optimizer", t + 1.0)
            tracker.optimizer_stepped(1, t + 1.0)
            t += 1.0
        records = tracker.log.records()
        assert tracker.source == "optimizer"
        assert [r.wall_s for r in records] == pytest.approx([1.0, 1.0, 1.0])
        last = records[-1]
        assert last.phases_s == pytest.approx({"data_wait": 0.5, "forward": 0.2, "backward": 0.1, "optimizer": 0.1})

    def test_forward_passes_and_the_backwards_after_them_are_counted_once_each(self) -> None:
        tracker = StepTracker(now=0.0)
        tracker.enter("backward", 0.0)  # before forwards are timed (the first step): not counted
        tracker.exit("backward", 0.1)
        t = 1.0
        for _ in range(2):  # a rollout: 3 forwards (one holding a nested root's forward), then one backward
            for _ in range(3):
                tracker.enter("forward", t)
                tracker.enter("forward", t + 0.01)  # nested: the same pass
                tracker.exit("forward", t + 0.02)
                tracker.exit("forward", t + 0.03)
                t += 0.1
            tracker.enter("backward", t)
            tracker.enter("backward", t + 0.01)  # backward() inside backward() (a gradient penalty): the same one
            tracker.exit("backward", t + 0.02)
            tracker.exit("backward", t + 0.03)
            tracker.optimizer_stepped(1, t + 0.1)
            t += 1.0
        assert tracker.passes == [6, 2]

    def test_with_two_optimizers_the_first_one_stepped_ends_the_step(self) -> None:
        tracker = StepTracker(now=0.0)
        for i in range(4):
            tracker.optimizer_stepped(10, 2.0 * i + 1.0)  # e.g. a GAN's discriminator, then its generator
            tracker.optimizer_stepped(20, 2.0 * i + 1.5)
        assert tracker.log.count == 4

    @staticmethod
    def gan_iterations(tracker: StepTracker, count: int, generator_every: int = 1) -> None:
        """A GAN's loop, one iteration every 3 s from t = 0: a batch (at +0.1 s), its discriminator's step (10, at
        +1 s: a forward and backward before it), then its generator's (20, at +2 s, every ``generator_every``-th
        iteration: a forward and backward from +1.5 s)."""
        for i in range(count):
            t = 3.0 * i
            tracker.batch_requested(t + 0.1)
            tracker.enter("forward", t + 0.2)
            tracker.exit("forward", t + 0.5)
            tracker.optimizer_stepped(10, t + 1.0)
            if i % generator_every == generator_every - 1:
                tracker.enter("backward", t + 1.5)
                tracker.exit("backward", t + 1.9)
                tracker.optimizer_stepped(20, t + 2.0)

    def test_a_gans_steps_come_to_end_at_its_generators_step_the_last_before_each_batch(self) -> None:
        # given a GAN's loop: a batch, the discriminator's step, the generator's
        tracker = StepTracker(now=0.0)
        self.gan_iterations(tracker, 6)
        # then once two iterations ended with the generator's step before the next batch, the step that ended at
        # the discriminator's is extended to the generator's (1 -> 5 s), and every step from then on is one
        # iteration from generator to generator, its forward and backward whole
        records = tracker.log.records()
        assert tracker.anchor_optimizer == 20
        assert [r.wall_s for r in records] == pytest.approx([1.0, 4.0, 3.0, 3.0, 3.0, 3.0])
        assert [r.phases_s["backward"] for r in records] == pytest.approx([0.0, 0.8, 0.4, 0.4, 0.4, 0.4])
        assert [r.phases_s["forward"] for r in records] == pytest.approx([0.3, 0.3, 0.3, 0.3, 0.3, 0.3])
        assert sum(r.wall_s for r in records) == pytest.approx(17.0)  # nothing lost or counted twice

    def test_a_critic_stepping_each_batch_and_a_generator_every_fifth_keeps_the_critics_steps(self) -> None:
        # a WGAN: the generator's step comes before the next batch only every 5th iteration, never two running
        tracker = StepTracker(now=0.0)
        self.gan_iterations(tracker, 20, generator_every=5)
        assert tracker.anchor_optimizer == 10
        assert tracker.log.count == 20
        assert [r.wall_s for r in tracker.log.records()][1:] == pytest.approx([3.0] * 19)

    def test_two_optimizers_over_one_models_parameters_end_the_step_at_the_second(self) -> None:
        # e.g. Muon for the matrices and AdamW for the rest, stepped one after the other, each batch
        tracker = StepTracker(now=0.0)
        for i in range(6):
            tracker.batch_requested(2.0 * i + 0.1)
            tracker.optimizer_stepped(10, 2.0 * i + 1.0)
            tracker.enter("optimizer", 2.0 * i + 1.0)
            tracker.exit("optimizer", 2.0 * i + 1.25)
            tracker.optimizer_stepped(20, 2.0 * i + 1.25)
        records = tracker.log.records()
        assert tracker.anchor_optimizer == 20
        assert [r.wall_s for r in records][2:] == pytest.approx([2.0] * 4)
        assert [r.phases_s["optimizer"] for r in records][2:] == pytest.approx([0.25] * 4)

    def test_explicit_steps_stay_where_the_script_marks_them_whatever_its_optimizers_do(self) -> None:
        tracker = StepTracker(now=0.0)
        for i in range(6):
            tracker.explicit(3.0 * i)
            tracker.batch_requested(3.0 * i + 0.1)
            tracker.optimizer_stepped(10, 3.0 * i + 1.0)
            tracker.optimizer_stepped(20, 3.0 * i + 2.0)
        assert tracker.source == "explicit"
        assert [r.wall_s for r in tracker.log.records()][1:] == pytest.approx([3.0] * 5)

    def test_an_optimizer_that_steps_on_its_own_in_a_later_phase_ends_the_steps_from_then_on(self) -> None:
        # phase 1 trains an encoder (optimizer 10), phase 2 a head with its own optimizer (20)
        tracker = StepTracker(now=0.0)
        for i in range(3):
            tracker.optimizer_stepped(10, i + 1.0)
        for i in range(5):
            tracker.optimizer_stepped(20, 4.0 + 0.5 * i)
        assert tracker.log.count == 3 + 4  # the head's first step joins the gap between the phases
        assert [r.wall_s for r in tracker.log.records()][-3:] == pytest.approx([0.5, 0.5, 0.5])

    def test_an_optimizer_replacing_the_last_ends_the_steps_from_its_first_step(self) -> None:
        # a new optimizer each epoch: it replaces the one before at once (that one was freed, or trained the same
        # parameters), and one given the freed one's id still begins anew (its loop is looked at again)
        tracker = StepTracker(now=0.0)
        for i in range(3):
            tracker.optimizer_stepped(10, i + 1.0)
        assert tracker.optimizer_stepped(20, 4.0, replaces=True)
        assert tracker.log.count == 4
        assert tracker.optimizer_stepped(20, 5.0, replaces=True) and tracker.log.count == 5
        assert not tracker.optimizer_stepped(20, 6.0) and tracker.log.count == 6

    def test_explicit_marks_take_over_from_optimizer_steps(self) -> None:
        tracker = StepTracker(now=0.0)
        tracker.optimizer_stepped(1, 1.0)
        tracker.optimizer_stepped(1, 2.0)
        tracker.explicit(2.5)
        tracker.optimizer_stepped(1, 3.0)  # ignored from now on
        tracker.explicit(3.5)
        assert tracker.source == "explicit"
        assert tracker.dropped == 2
        assert [r.wall_s for r in tracker.log.records()] == pytest.approx([2.5, 1.0])

    def test_without_an_optimizer_each_batch_is_a_step_and_epoch_ends_are_not(self) -> None:
        tracker = StepTracker(now=0.0)
        t = 10.0
        for epoch in range(2):
            for batch in range(3):
                tracker.batch_requested(t)
                tracker.enter("data_wait", t)
                tracker.exit("data_wait", t + 0.25)
                t += 1.0
            tracker.batch_requested(t)  # the call that raises StopIteration
            tracker.batch_exhausted(t)
            t += 100.0  # an evaluation pass between epochs
        assert tracker.source == "dataloader"
        walls = [r.wall_s for r in tracker.log.records()]
        assert walls == pytest.approx([1.0] * 6)
        assert all(r.phases_s["data_wait"] == pytest.approx(0.25) for r in tracker.log.records())

    def test_with_neither_optimizer_nor_loader_each_backward_ends_a_step(self) -> None:
        # given: a loop that slices its batch from a tensor and updates its parameters by hand, 5 iterations
        tracker = StepTracker(now=0.0)
        t = 0.0
        for _ in range(5):
            tracker.enter("forward", t)
            tracker.exit("forward", t + 0.3)
            tracker.enter("backward", t + 0.3)
            tracker.exit("backward", t + 0.8)
            tracker.backward_ended(t + 0.8)
            t += 1.0  # the hand-written update, then the next batch's slice
        # then: one step per iteration, each ending as its backward returns
        assert tracker.source == "backward" and tracker.dropped == 0
        assert [r.wall_s for r in tracker.log.records()] == pytest.approx([0.8, 1.0, 1.0, 1.0, 1.0])
        assert tracker.log.records()[0].phases_s == pytest.approx(
            {"data_wait": 0.0, "forward": 0.3, "backward": 0.5, "optimizer": 0.0})
        assert tracker.log.records()[-1].phases_s == pytest.approx(
            {"data_wait": 0.0, "forward": 0.3, "backward": 0.5, "optimizer": 0.0})

    def test_listeners_hear_each_step_of_a_backward_defined_loop_begin_once_and_only_as_it_begins(self) -> None:
        # given: a hand-written loop, its steps defined by backward() once the second one has returned
        tracker = StepTracker(now=0.0)
        begun: list[int] = []
        tracker.listeners.append(begun.append)
        for i in range(5):
            tracker.backward_ended(i + 0.5)
        # then: step 1 had run by then and is not announced after the fact; every later step is, as it begins
        assert begun == [2, 3, 4, 5]
        assert tracker.log.count == 5

    def test_an_optimizer_stepping_after_the_first_backward_defines_the_steps_and_loses_no_time(self) -> None:
        tracker = StepTracker(now=0.0)
        for i in range(4):
            tracker.enter("backward", i + 0.25)
            tracker.exit("backward", i + 0.5)
            tracker.backward_ended(i + 0.5)
            tracker.optimizer_stepped(1, i + 1.0)
        assert tracker.source == "optimizer" and tracker.dropped == 0
        assert tracker.log.count == 4
        assert tracker.log.records()[0].phases_s["backward"] == pytest.approx(0.25)  # held, then given back

    def test_a_loader_outranks_backward_as_the_step_marker(self) -> None:
        tracker = StepTracker(now=0.0)
        for i in range(4):
            tracker.batch_requested(float(i))
            tracker.backward_ended(i + 0.5)
        assert tracker.source == "dataloader"

    def test_gpuscopes_own_time_is_kept_out_of_the_step(self) -> None:
        tracker = StepTracker(now=0.0)
        tracker.optimizer_stepped(1, 1.0)
        tracker.discount(1.0, 1.4)  # e.g. finding the root modules
        tracker.optimizer_stepped(1, 2.4)
        assert tracker.log.records()[-1].wall_s == pytest.approx(1.0)

    def test_steps_touched_by_a_profiling_window_are_marked_profiled(self) -> None:
        tracker = StepTracker(now=0.0)
        begun = []
        tracker.listeners.append(begun.append)
        tracker.optimizer_stepped(1, 1.0)  # step 0: no window
        tracker.window_opened()  # during step 1
        tracker.optimizer_stepped(1, 2.0)
        tracker.optimizer_stepped(1, 3.0)  # step 2: wholly inside
        tracker.window_closed()  # during step 3
        tracker.optimizer_stepped(1, 4.0)
        tracker.optimizer_stepped(1, 5.0)  # step 4: after
        assert [r.profiled for r in tracker.log.records()] == [False, True, True, True, False]
        assert begun == [1, 2, 3, 4, 5]

    def test_a_window_a_listener_opens_at_a_steps_start_covers_that_step_only_from_then(self) -> None:
        tracker = StepTracker(now=0.0)

        def profile_step_2_only(index: int) -> None:
            if index == 2:
                tracker.window_opened()
            elif index == 3:
                tracker.window_closed()

        tracker.listeners.append(profile_step_2_only)
        for t in range(1, 6):
            tracker.optimizer_stepped(1, float(t))
        assert [r.profiled for r in tracker.log.records()] == [False, False, True, False, False]

    def test_after_the_first_steps_only_every_eighth_steps_phases_are_marked_on_the_device(self) -> None:
        # given 60 steps of a forward and a backward each, the device passing every marker at once
        device = FakeDevice()
        tracker = StepTracker(now=0.0)
        tracker.attach_device(device.timeline())
        for step in range(60):
            t = float(step)
            tracker.enter("forward", t + 0.1)
            tracker.exit("forward", t + 0.2)
            tracker.enter("backward", t + 0.3)
            tracker.exit("backward", t + 0.4)
            tracker.optimizer_stepped(1, t + 1.0)
            device.run_until_idle()
        tracker.finish()
        records = {r.index: r for r in tracker.log.records()}
        # then every step has its device time (but the first: the optimizer's steps were counted from its end), and
        # the phases are those of steps 1-31, 32, 40, 48 and 56
        assert all(records[i].device_wall_s is not None for i in range(1, 60))
        assert [i for i in range(60) if records[i].device_phases_s is not None] == [*range(1, 32), 32, 40, 48, 56]
        # and the markers: one as timing began, step 0's four phase changes, one at each step's start, and the four
        # phase changes of the 35 steps whose phases were marked
        assert len(device.queue) == 1 + 4 + 60 + 4 * 35

    def test_device_times_attach_to_their_steps(self) -> None:
        device = FakeDevice()
        tracker = StepTracker(now=0.0)
        tracker.optimizer_stepped(1, 1.0)
        tracker.attach_device(device.timeline())
        tracker.enter("forward", 1.1)
        tracker.exit("forward", 1.2)
        tracker.optimizer_stepped(1, 2.0)
        tracker.enter("forward", 2.1)
        # markers: step 1 begins, forward begins, forward ends, step 2 begins, step 2's forward begins
        device.reach(0.0, 5.0, 45.0, 50.0, 52.0)
        tracker.optimizer_stepped(1, 3.0)
        tracker.finish()
        step1 = tracker.log.find(1)
        assert step1 is not None
        assert step1.device_wall_s == pytest.approx(0.050)
        assert step1.device_phases_s == pytest.approx({"other": 0.010, "forward": 0.040})
