"""The practices collector, in this process on real torch: it sees debug APIs left on, zero-filled gradients,
biases feeding BatchNorm and DataParallel, names the user's lines, and leaves torch as it found it."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from gpuscope.collect.collectors.practices import PracticesCollector, inspect_modules  # noqa: E402
from gpuscope.collect.collectors.steps import StepsCollector  # noqa: E402
from gpuscope.session import Session  # noqa: E402


def practices_of(tmp_path: Path, train, steps: int = 6):
    """Run ``train(model, opt, i)`` for each step under a session of the steps and practices collectors."""
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    session = Session(tmp_path, ["in-process"], [StepsCollector(), PracticesCollector()])
    session.start()
    try:
        for i in range(steps):
            train(model, opt, i)
    finally:
        record = session.stop(0)
    assert record.collectors["practices"].status == "ok"
    return record.practices


def plain_step(model, opt, i, set_to_none=True):
    loss = model(torch.randn(16, 4)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=set_to_none)


def test_a_clean_loop_shows_no_bad_habit(tmp_path: Path) -> None:
    practices = practices_of(tmp_path, plain_step)
    assert practices.steps_checked >= 5
    assert (practices.anomaly_steps, practices.profiler_steps, practices.zero_grad_fill_calls) == (0, 0, 0)
    assert practices.zero_grad_calls == 6
    assert practices.gradcheck_sites == () and practices.data_parallel == ()
    assert practices.modules_inspected
    assert practices.torch_version == torch.__version__


def test_anomaly_detection_inside_each_step_is_counted_with_its_line(tmp_path: Path) -> None:
    def step(model, opt, i):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly():  # the line to name
                loss = model(torch.randn(16, 4)).sum()
                loss.backward()
        opt.step()
        opt.zero_grad()

    practices = practices_of(tmp_path, step)
    assert practices.anomaly_steps >= 5
    (site,) = practices.anomaly_sites
    assert site.file.endswith("test_practices.py") and site.calls == 6
    assert site.code == "with torch.autograd.detect_anomaly():  # the line to name"
    assert not torch.is_anomaly_enabled()


def test_anomaly_detection_switched_on_for_the_whole_run_is_counted_every_step(tmp_path: Path) -> None:
    def step(model, opt, i):
        if i == 0:
            torch.autograd.set_detect_anomaly(True)
        plain_step(model, opt, i)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            practices = practices_of(tmp_path, step)
    finally:
        torch.autograd.set_detect_anomaly(False)
    assert practices.anomaly_steps == practices.steps_checked
    assert [s.calls for s in practices.anomaly_sites] == [1]


def test_the_users_own_autograd_profiler_and_gradcheck_are_seen(tmp_path: Path) -> None:
    def step(model, opt, i):
        if i == 1:
            torch.autograd.gradcheck(torch.sin, (torch.randn(3, dtype=torch.double, requires_grad=True),))
        with torch.autograd.profiler.profile():
            plain_step(model, opt, i)
            if i < 5:
                opt.zero_grad()  # so a step boundary falls inside the profiler
                model(torch.randn(16, 4)).sum().backward()
                opt.step()

    practices = practices_of(tmp_path, step)
    assert practices.profiler_steps >= 4
    assert [s.calls for s in practices.gradcheck_sites] == [1]
    assert "gradcheck" in practices.gradcheck_sites[0].code


def test_zero_filled_gradients_are_counted_with_their_line(tmp_path: Path) -> None:
    practices = practices_of(tmp_path, lambda m, o, i: plain_step(m, o, i, set_to_none=False))
    assert (practices.zero_grad_calls, practices.zero_grad_fill_calls) == (6, 6)
    assert practices.zero_grad_fill_sites[0].code == "opt.zero_grad(set_to_none=set_to_none)"


def test_the_model_is_read_for_biases_before_batchnorm_data_parallel_and_conv_layout() -> None:
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, bias=True), nn.BatchNorm2d(8),          # wasted bias: 8
        nn.Conv2d(8, 8, 3, bias=False), nn.BatchNorm2d(8),         # fine
        nn.Conv2d(8, 4, 3), nn.ReLU(), nn.BatchNorm2d(4),          # not directly feeding
        nn.Flatten(), nn.Linear(4, 6), nn.BatchNorm1d(6),          # wasted bias: 6
        nn.Linear(6, 5), nn.BatchNorm1d(6),                        # widths differ: another tensor
    ).to(memory_format=torch.channels_last)
    facts = inspect_modules(torch, [nn.DataParallel(net)])
    assert facts["bias_before_norm"] == (
        "module.0 (Conv2d) -> module.1 (BatchNorm2d)",
        "module.8 (Linear) -> module.9 (BatchNorm1d)",
    )
    assert facts["wasted_bias_params"] == 14
    gpus = torch.cuda.device_count()  # DataParallel takes every visible GPU: none here, one on a GPU machine
    assert facts["data_parallel"] == (f"DataParallel(Sequential) on {gpus} device{'s' if gpus != 1 else ''}",)
    assert (facts["conv_layers"], facts["channels_last_convs"]) == (3, 3)


def test_every_patch_is_undone(tmp_path: Path) -> None:
    distribution = torch.distributions.Distribution
    before = (torch.set_anomaly_enabled, torch.autograd.gradcheck, torch.optim.Optimizer.zero_grad,
              nn.Module.zero_grad, distribution.__init__, distribution._validate_sample)
    practices_of(tmp_path, plain_step)
    assert (torch.set_anomaly_enabled, torch.autograd.gradcheck, torch.optim.Optimizer.zero_grad,
            nn.Module.zero_grad, distribution.__init__, distribution._validate_sample) == before


def test_cpu_autocast_in_a_reduced_dtype_is_named_with_its_line(tmp_path: Path) -> None:
    enter = torch.amp.autocast_mode.autocast.__enter__

    def step(model, opt, i):
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the autocast line
            loss = model(torch.randn(16, 4)).float().sum()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):  # disabled: not counted
            pass
        loss.backward()
        opt.step()
        opt.zero_grad()

    practices = practices_of(tmp_path, step)
    (site,) = practices.cpu_autocast_sites
    assert site.file.endswith("test_practices.py") and site.calls == 6
    assert site.code == 'with torch.autocast("cpu", dtype=torch.bfloat16):  # the autocast line'
    assert practices.cpu_autocast_by == ""  # entered by the user's own code, not a library's
    assert torch.amp.autocast_mode.autocast.__enter__ is enter  # left as it was found
    assert practices_of(tmp_path, plain_step).cpu_autocast_sites == ()


def test_the_lines_that_make_float64_the_models_or_torchs_dtype_are_named(tmp_path: Path) -> None:
    patched = (nn.Module.double, nn.Module.half, nn.Module.bfloat16, nn.Module.to, torch.set_default_dtype)
    default = torch.get_default_dtype()

    def step(model, opt, i):
        if i == 0:
            model.double()  # made float64
            model.to(dtype=torch.float64)  # made float64 again
            model.to(torch.float32)  # not float64: not counted
            model.to("cpu")  # nor a device
            torch.set_default_dtype(torch.float64)  # torch's default made float64
            torch.set_default_dtype(default)  # not float64: not counted
        plain_step(model, opt, i)

    practices = practices_of(tmp_path, step)
    assert [site.code for site in practices.float64_sites] == [
        "model.double()  # made float64", "model.to(dtype=torch.float64)  # made float64 again",
        "torch.set_default_dtype(torch.float64)  # torch's default made float64"]
    assert practices.half_precision_sites == ()
    assert (nn.Module.double, nn.Module.half, nn.Module.bfloat16, nn.Module.to,
            torch.set_default_dtype) == patched  # left as they were found
    assert practices_of(tmp_path, plain_step).float64_sites == ()


def test_an_autocast_a_library_enters_is_named_with_the_library_and_the_users_line_into_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a library (installed in site-packages, as Lightning is) whose fit() enters a CPU bfloat16 autocast
    library = tmp_path / "site-packages" / "fittinglib"
    library.mkdir(parents=True)
    (library / "__init__.py").write_text(
        "import torch\n\ndef fit(step, *args):\n    with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "        step(*args)\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    import fittinglib

    def step(model, opt, i):
        fittinglib.fit(plain_step, model, opt, i)  # the user's line into the library

    # when
    practices = practices_of(tmp_path, step)
    # then
    (site,) = practices.cpu_autocast_sites
    assert site.code == "fittinglib.fit(plain_step, model, opt, i)  # the user's line into the library"
    assert practices.cpu_autocast_by == "fittinglib"


def test_the_lines_that_make_half_precision_the_models_dtype_are_named(tmp_path: Path) -> None:
    def step(model, opt, i):
        if i == 0:
            model.half()  # made float16
            model.to(torch.bfloat16)  # made bfloat16
            model.bfloat16()  # and again
            model.float()  # back: not counted
        plain_step(model, opt, i)

    practices = practices_of(tmp_path, step)
    assert [site.code for site in practices.half_precision_sites] == [
        "model.half()  # made float16", "model.to(torch.bfloat16)  # made bfloat16", "model.bfloat16()  # and again"]
    assert practices.float64_sites == ()


def policy_step(validate: bool | None):
    """A step of a policy gradient: a distribution built from the model's output, sampled and scored."""
    def step(model, opt, i):
        logits = model(torch.randn(16, 4)).squeeze(1)
        dist = torch.distributions.Categorical(logits=logits, validate_args=validate)  # the line to name
        action = dist.sample()
        loss = -dist.log_prob(action)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def test_distribution_checks_are_timed_step_by_step_with_the_line_that_built_them(tmp_path: Path) -> None:
    practices = practices_of(tmp_path, policy_step(validate=None))  # torch's default: checked
    # each step ended at a boundary is kept: one distribution built and one sample scored, both checked
    assert len(practices.distribution_check_steps) >= 4
    assert practices.distribution_check_steps == tuple(sorted(practices.distribution_check_steps))
    assert set(practices.distribution_check_counts) == {2}
    assert all(0 < s < 0.1 for s in practices.distribution_check_s)
    (site,) = practices.distribution_sites
    assert site.code.endswith("# the line to name") and site.calls == 6


def test_distributions_built_without_checks_leave_nothing_to_time(tmp_path: Path) -> None:
    practices = practices_of(tmp_path, policy_step(validate=False))
    assert (practices.distribution_check_steps, practices.distribution_check_s, practices.distribution_sites) == (
        (), (), ())
