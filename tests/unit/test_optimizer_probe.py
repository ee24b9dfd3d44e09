"""The optimizer probe and the fused-optimizer rule: after the run, the loop's own optimizer is built again over
copies of its parameters, as the run ran it and with ``fused=True``, and both updates are timed; the rule turns the
two times and the optimizer's share of the step into the expected gain. The run is left as the script left it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gpuscope
from conftest import make_record
from gpuscope.diagnose.rules import evaluate
from gpuscope.collect.collectors import optimizer_probe
from gpuscope.collect.collectors.optimizer_probe import OptimizerProbeCollector
from gpuscope.record import Breakdown, CallSite, OptimizerProbe, Practices
from gpuscope.session import post_run_facts


def trained(optimizer_class: type, **options: object) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small model after one real update by ``optimizer_class(**options)``."""
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(6)])
    optimizer = optimizer_class(model.parameters(), lr=1e-3, **options)
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    return model, optimizer


def probe(optimizer: object) -> tuple[str, object]:
    result = OptimizerProbeCollector().run(None, post_run_facts(optimizer=optimizer))  # type: ignore[arg-type]
    return result.status.status, result.payload if result.payload is not None else result.status.reason


# -- the probe -----------------------------------------------------------------------------------------------
def test_the_update_is_timed_as_run_and_fused_on_copies_and_the_run_is_left_as_it_was() -> None:
    # given: Adam after an update, with its state, gradients and the random generator as the script left them
    model, optimizer = trained(torch.optim.Adam)
    params = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    state = [{k: v.clone() for k, v in s.items()} for s in optimizer.state.values()]
    rng = torch.get_rng_state()
    # when
    status, found = probe(optimizer)
    # then: both updates timed, over every tensor, as the run ran it (one tensor at a time, a CPU's default)
    assert status == "ok"
    assert isinstance(found, OptimizerProbe)
    assert (found.optimizer, found.implementation, found.device) == ("Adam", "for-loop", "cpu")
    assert (found.tensors, found.timed_tensors, found.parameters) == (12, 12, 6 * (16 * 16 + 16))
    assert found.step_s and found.fused_step_s and found.note == ""
    # and nothing of the run's changed
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters()))
    assert all(torch.equal(a[k], b[k]) for a, b in zip(state, optimizer.state.values()) for k in a)
    assert torch.equal(rng, torch.get_rng_state())


def test_an_optimizer_asked_for_foreach_is_timed_as_foreach() -> None:
    _, optimizer = trained(torch.optim.SGD, momentum=0.9, foreach=True)
    status, found = probe(optimizer)
    assert status == "ok" and found.implementation == "foreach" and found.fused_step_s  # type: ignore[union-attr]


def test_an_optimizer_already_fused_is_recorded_and_not_timed_again() -> None:
    _, optimizer = trained(torch.optim.AdamW, fused=True)
    status, found = probe(optimizer)
    assert status == "ok"
    assert found.implementation == "fused" and found.step_s is None  # type: ignore[union-attr]


def test_an_optimizer_with_no_fused_update_is_not_probed_and_says_so() -> None:
    _, optimizer = trained(torch.optim.RMSprop)
    assert probe(optimizer) == ("unavailable", "RMSprop's constructor takes no fused argument (torch's Adam, AdamW, "
                                               "SGD and Adagrad do)")
    assert probe(None) == ("unavailable", "no optimizer stepped in the training loop")


def test_an_update_too_small_a_share_of_the_step_to_advise_on_is_not_timed() -> None:
    _, optimizer = trained(torch.optim.Adam)
    facts = post_run_facts(optimizer=optimizer, optimizer_share=0.04)  # under the rule's 5%
    result = OptimizerProbeCollector().run(None, facts)  # type: ignore[arg-type]
    assert (result.status.status, result.status.reason) == (
        "unavailable", "not run: the optimizer's update is too small a share of the step to advise on")


def test_a_subclass_that_cannot_be_built_from_its_hyperparameters_is_not_probed_and_says_why() -> None:
    class Scheduled(torch.optim.SGD):
        def __init__(self, params, lr, schedule, fused=None):  # noqa: ANN001 (a user's own optimizer)
            super().__init__(params, lr=lr, fused=fused)

    status, reason = probe(Scheduled(torch.nn.Linear(2, 2).parameters(), lr=0.1, schedule="cosine"))
    assert status == "unavailable" and str(reason).startswith("Scheduled could not be built again over copies")


def test_a_model_over_the_size_cap_is_timed_on_its_first_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    _, optimizer = trained(torch.optim.Adam)
    monkeypatch.setattr(optimizer_probe, "PROBE_BYTES", 3 * (16 * 16 * 4))
    status, found = probe(optimizer)
    assert status == "ok" and (found.tensors, found.timed_tensors) == (12, 4)  # type: ignore[union-attr]
    assert found.note.startswith("timed on the first 4 tensors")  # type: ignore[union-attr]


def test_optimizers_of_its_class_stepped_beside_it_are_timed_with_it() -> None:
    # given: an Adam a parameter (PyTorch's optimizer-in-backward tutorial), and an SGD beside them
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
    adams = [torch.optim.Adam([p], lr=1e-3) for p in model.parameters()]
    sgd = torch.optim.SGD(torch.nn.Linear(2, 2).parameters())
    model(torch.randn(4, 16)).sum().backward()
    # when the first is probed with its peers (the steps collector's: those of its class that stepped with it)
    facts = post_run_facts(optimizer=adams[0], optimizer_peers=tuple(adams))
    found = OptimizerProbeCollector().run(None, facts).payload  # type: ignore[arg-type]
    # then an update is all six Adams'
    assert (found.optimizers, found.tensors, found.timed_tensors) == (6, 6, 6)  # type: ignore[union-attr]
    assert found.parameters == 3 * (16 * 16 + 16) and found.fused_step_s  # type: ignore[union-attr]
    assert sgd.param_groups  # (not among them: not of its class, not a peer)


def test_the_loops_optimizer_is_probed_after_the_block_that_made_it_has_let_it_go(tmp_path) -> None:
    # given: a training function whose model and optimizer are gone when it returns, as in most scripts
    def train() -> None:
        _, optimizer = trained(torch.optim.AdamW)
        model = optimizer.param_groups[0]["params"]
        for _ in range(8):
            sum(p.sum() for p in model).backward()
            optimizer.step()
            optimizer.zero_grad()

    # when it runs profiled, with the post-run probes
    with gpuscope.profile(output=str(tmp_path / "run"), quiet=True) as prof:
        train()
    # then the steps collector kept the first optimizer for the probe, and the line that built it was seen
    assert prof.record.collectors["optimizer-probe"].status == "ok"
    assert prof.record.optimizer_probe.optimizer == "AdamW"  # type: ignore[union-attr]
    (site,) = prof.record.practices.optimizer_sites  # type: ignore[union-attr]
    assert (site.function, site.code) == ("trained", "optimizer = optimizer_class(model.parameters(), lr=1e-3, **options)")


# -- the rule ------------------------------------------------------------------------------------------------
def run_with(optimizer_share: float, step_s: float | None, fused_step_s: float | None, implementation: str = "for-loop"):
    return make_record(
        breakdown=Breakdown(data_wait=0.0, forward=0.3, backward=0.3, optimizer=optimizer_share,
                            other=0.4 - optimizer_share),
        optimizer_probe=OptimizerProbe(optimizer="AdamW", implementation=implementation, device="cpu", tensors=64,
                                       parameters=49976, timed_tensors=64, step_s=step_s, fused_step_s=fused_step_s))


def test_a_slow_unfused_update_is_told_to_fuse_with_the_gain_the_probe_measured() -> None:
    # given: the launch-bound sample's figures on the 2-core machine: AdamW's update 43% of a 7.0 ms step, timed
    # after the run at 5.58 ms as run and 0.92 ms fused
    record = dataclasses.replace(run_with(0.43, 5.58e-3, 0.92e-3), steps=dataclasses.replace(
        make_record().steps, median_s=7.0e-3))
    recommendations, checks = evaluate(record)
    fused = {r.id: r for r in recommendations}["fused-optimizer"]
    # then: the gain is the share the fused update would save, and the evidence holds the figures
    assert fused.expected_gain == pytest.approx(0.43 * (1 - 0.92 / 5.58), abs=1e-3)
    assert fused.evidence[0] == "the optimizer's update is 43% of the step (3.01 ms of the 7.0 ms median step)"
    assert "5.58 ms an update as the run ran it, 0.92 ms with fused=True (6.1x faster)" in fused.evidence[2]
    assert fused.fix == "torch.optim.AdamW(..., fused=True)"


def test_the_fix_names_the_users_line_that_built_the_optimizer_not_a_librarys() -> None:
    built = CallSite(file="train.py", line=41, code="opt = torch.optim.AdamW(model.parameters(), lr=1e-3)", calls=1)
    by_trainer = CallSite(file="train.py", line=60, code="trainer.train()", calls=1)
    second = dataclasses.replace(built, line=42, code="opt_g = torch.optim.AdamW(generator.parameters())")
    for sites, fix in [((by_trainer, built), "torch.optim.AdamW(..., fused=True)  # train.py:41"),
                       ((built, second), "torch.optim.AdamW(..., fused=True)  # train.py:41, train.py:42"),
                       ((by_trainer,), "torch.optim.AdamW(..., fused=True)")]:
        record = dataclasses.replace(run_with(0.4, 5e-3, 1e-3), practices=Practices(optimizer_sites=sites))
        assert {r.id: r for r in evaluate(record)[0]}["fused-optimizer"].fix == fix


def test_beside_an_optimizer_of_another_class_the_gain_is_the_probed_ones_own_saving() -> None:
    # given: a recommender's loop on the 2-core machine: a sparse embedding table's SparseAdam and a dense MLP's
    # Adam, whose updates together are 42% of an 8.7 ms step; the probe timed Adam's: 0.30 ms as run, 0.08 fused
    sites = (CallSite(file="train.py", line=12, code="sparse_opt = torch.optim.SparseAdam(emb.parameters())"),
             CallSite(file="train.py", line=13, code="dense_opt = torch.optim.Adam(mlp.parameters(), lr=1e-3)"))
    record = dataclasses.replace(run_with(0.42, 0.30e-3, 0.08e-3), practices=Practices(optimizer_sites=sites),
                                 steps=dataclasses.replace(make_record().steps, median_s=8.7e-3))
    record = dataclasses.replace(record, optimizer_probe=dataclasses.replace(record.optimizer_probe, optimizer="Adam"))
    fused = {r.id: r for r in evaluate(record)[0]}["fused-optimizer"]
    # then: fused=True on Adam saves Adam's 0.22 ms a step (2.5%), not 42% x (1 - 0.08 / 0.30) = 31% (the phase is
    # mostly SparseAdam's); the fix names Adam's line only, and the evidence says why
    assert fused.expected_gain == pytest.approx(0.22e-3 / 8.7e-3, abs=1e-3)
    assert fused.fix == "torch.optim.Adam(..., fused=True)  # train.py:13"
    assert fused.evidence[-1].startswith("the script also builds SparseAdam, whose updates share the optimizer's time")


def test_several_optimizers_probed_together_are_named_as_such_and_their_saving_not_counted_again() -> None:
    sites = (CallSite(file="train.py", line=12, code="opts = {p: torch.optim.AdamW([p]) for p in model.parameters()}"),
             CallSite(file="train.py", line=13, code="head_opt = torch.optim.SGD(head.parameters())"))
    record = dataclasses.replace(run_with(0.2, 2.0e-3, 1.0e-3), practices=Practices(optimizer_sites=sites),
                                 steps=dataclasses.replace(make_record().steps, median_s=20e-3))
    record = dataclasses.replace(record, optimizer_probe=dataclasses.replace(record.optimizer_probe, optimizers=64))
    fused = {r.id: r for r in evaluate(record)[0]}["fused-optimizer"]
    assert fused.evidence[1].startswith("64 AdamW optimizers, stepped together each step, update 64 tensors")
    assert fused.expected_gain == pytest.approx(1.0e-3 / 20e-3)  # the 64's saving, under 20% x (1 - 1/2)


def test_inside_a_wrapper_optimizers_step_the_gain_is_the_share_its_inner_updates_took() -> None:
    # given: DDP with ZeroRedundancyOptimizer(optimizer_class=Adam) on 2 gloo ranks (2-core VM): the optimizer phase
    # 38% of a 51.1 ms step, of which Adam's own steps 23% (the rest ZeRO's broadcast of the updated shards); Adam
    # timed after the run at 4.43 ms as run, 1.47 ms fused
    record = dataclasses.replace(run_with(0.38, 4.43e-3, 1.47e-3),
                                 steps=dataclasses.replace(make_record().steps, median_s=51.1e-3))
    record = dataclasses.replace(record, optimizer_probe=dataclasses.replace(
        record.optimizer_probe, optimizer="Adam", update_share=0.23, around="ZeroRedundancyOptimizer"))
    fused = {r.id: r for r in evaluate(record)[0]}["fused-optimizer"]
    # then: 38% x 23% x (1 - 1.47 / 4.43) = 5.8%, Adam's saving a step (2.96 ms of 51.1), not 25.6%
    assert fused.expected_gain == pytest.approx(0.38 * 0.23 * (1 - 1.47 / 4.43), abs=1e-3)
    assert fused.evidence[-1].startswith("Adam's own steps were 23% of the optimizer's time in the run; the rest was "
                                         "ZeroRedundancyOptimizer's own work around them")
    whole = dataclasses.replace(record, optimizer_probe=dataclasses.replace(record.optimizer_probe, update_share=0.95))
    assert {r.id: r for r in evaluate(whole)[0]}["fused-optimizer"].expected_gain == pytest.approx(
        0.38 * (1 - 1.47 / 4.43), abs=1e-3)


@pytest.mark.parametrize(("record", "why"), [
    (run_with(0.03, 5e-3, 1e-3), "the update is under 5% of the step"),
    (run_with(0.4, 1.1e-3, 1e-3), "fused is under 1.2x faster"),
    (run_with(0.4, None, None, implementation="fused"), "the run's update is fused already"),
    (run_with(0.4, 5e-3, None), "fused=True could not be built"),
])
def test_no_fused_update_is_advised_where_it_would_not_pay(record, why: str) -> None:
    assert evaluate(record)[1]["fused-optimizer"].status == "clear", why


def test_without_the_probe_the_rule_says_it_was_not_checked() -> None:
    check = evaluate(make_record())[1]["fused-optimizer"]
    assert (check.status, check.reason) == ("not-checked", "the optimizer's update was not timed again")
