"""The optimizer's update, timed again after the run as the run ran it and with ``fused=True``.

torch's optimizers update the parameters one tensor at a time (the ``for-loop`` implementation, the default on a
CPU), as a few ops over lists of tensors (``foreach``, the default on CUDA), or in one kernel for all (``fused``,
on CUDA, and on a CPU since torch 2.4, for Adam, AdamW, SGD and Adagrad). On a model of many small tensors the
first two spend the update launching ops. After the script has ended, this probe builds two optimizers of the
loop's own class and hyperparameters over copies of its parameters and gradients (the first ones, up to
``PROBE_BYTES``), one as the run ran and one with ``fused=True``, and times an update of each, best of a few
bursts taken in turns. Where the loop stepped several optimizers of that class in a step (a GAN's two, one per
parameter as in PyTorch's optimizer-in-backward tutorial), each is copied so, and an update is all of theirs.
The run's parameters, optimizer state and random number generators are left as the script left them.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect.framework.base import CollectorResult, PostRunProbe, register
from gpuscope.record import CollectorStatus, OptimizerProbe

if TYPE_CHECKING:
    from gpuscope.collect.captures import PostRunFacts

PROBE_BYTES = 32 * 2**20
"""Parameter bytes copied, for each of the two optimizers (each copy also holds its gradient and, for Adam, two
state tensors: eight times this at most in all); a larger model is timed on its first tensors up to this size."""
BURST_S = 0.02
"""A timed burst of updates lasts about this long; the best of ``BURSTS`` is kept (noise only ever adds time)."""
BURSTS = 5


@register
class OptimizerProbeCollector(PostRunProbe):
    """Times the loop's optimizer update again, as run and fused, on copies of its parameters."""

    name: ClassVar[str] = "optimizer-probe"
    field: ClassVar[str | None] = "optimizer_probe"
    budget_s: ClassVar[float] = 2.0
    doing: ClassVar[str] = "timing the optimizer's update with fused=True"

    def run(self, run_dir: Path, facts: PostRunFacts) -> CollectorResult:
        torch, optimizer = sys.modules.get("torch"), facts.optimizer
        if torch is None or optimizer is None:
            return _unavailable("no optimizer stepped in the training loop")
        if not facts.optimizer_notable:
            return _unavailable("not run: the optimizer's update is too small a share of the step to advise on")
        name = type(optimizer).__name__
        if "fused" not in inspect.signature(type(optimizer).__init__).parameters:
            return _unavailable(f"{name}'s constructor takes no fused argument (torch's Adam, AdamW, SGD and "
                                "Adagrad do)")
        peers = [o for o in facts.optimizer_peers if o is not optimizer]
        everyone = [optimizer, *peers]
        groups = [group for o in everyone for group in o.param_groups]
        params = [p for group in groups for p in group["params"]]
        devices = {p.device.type for p in params}
        implementation = _implementation(torch, groups, params)
        found = OptimizerProbe(optimizer=name, implementation=implementation, device=",".join(sorted(devices)),
                               tensors=len(params), parameters=sum(p.numel() for p in params),
                               optimizers=len(everyone), update_share=facts.optimizer_update_share,
                               around=facts.optimizer_around)
        if implementation == "fused":
            return CollectorResult(CollectorStatus("ok"), found)
        if devices - {"cpu", "cuda"} or len(devices) != 1 or any(g.get("differentiable") for g in groups):
            return _unavailable(f"{name} over {found.device} tensors: not timed (fused needs one CPU or CUDA device "
                                "and no differentiable update)")
        timed = _first_tensors(params, PROBE_BYTES)
        cuda = "cuda" in devices
        if cuda and torch.cuda.mem_get_info(params[0].device)[0] < 8 * sum(_bytes(p) for p in timed):
            return _unavailable("too little free GPU memory to copy the parameters")
        deadline = time.perf_counter() + self.budget_s
        with torch.random.fork_rng(devices=[params[0].device] if cuda else []), torch.no_grad():
            try:
                as_run, note = [_copies(torch, everyone, timed, {})], ""
            except Exception as exc:  # a subclass whose constructor wants more than its hyperparameters
                return _unavailable(f"{name} could not be built again over copies: {type(exc).__name__}: {exc}")
            try:
                fused = [_copies(torch, everyone, timed, {"fused": True, "foreach": None})]
            except Exception as exc:  # this torch, device or dtype has no fused update
                fused, note = [], f"fused=True could not be built: {type(exc).__name__}: {exc}"
            step_s, *fused_s = _best_updates(as_run + fused, deadline, cuda, torch)
        if len(timed) < len(params):
            note = f"timed on the first {len(timed)} tensors ({PROBE_BYTES >> 20} MiB of parameters)" + (
                f"; {note}" if note else "")
        return CollectorResult(CollectorStatus("ok"), dataclasses.replace(
            found, timed_tensors=len(timed), step_s=step_s, fused_step_s=fused_s[0] if fused_s else None, note=note))


def _unavailable(reason: str) -> CollectorResult:
    return CollectorResult(CollectorStatus("unavailable", reason))


def _implementation(torch: Any, groups: list[dict[str, Any]], params: list[Any]) -> str:
    """``fused``, ``foreach`` or ``for-loop``: what the update ran as (torch picks foreach where asked for none,
    for tensors all on CUDA)."""
    if any(g.get("fused") for g in groups):
        return "fused"
    asked = [g.get("foreach") for g in groups]
    if any(asked):
        return "foreach"
    if any(a is False for a in asked):
        return "for-loop"
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        _, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    except Exception:
        foreach = all(p.is_cuda for p in params)
    return "foreach" if foreach else "for-loop"


def _bytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def _first_tensors(params: list[Any], limit: int) -> list[Any]:
    """The first parameters, up to ``limit`` bytes (at least one)."""
    taken, size = [], 0
    for p in params:
        if taken and size + _bytes(p) > limit:
            break
        taken.append(p)
        size += _bytes(p)
    return taken


def _copies(torch: Any, optimizers: list[Any], timed: list[Any], options: dict[str, Any]) -> list[Any]:
    """``_copy`` of each of ``optimizers`` that updates some of the ``timed`` parameters."""
    chosen = {id(p) for p in timed}
    return [_copy(torch, o, o.param_groups, timed, options) for o in optimizers
            if any(id(p) in chosen for group in o.param_groups for p in group["params"])]


def _copy(torch: Any, optimizer: Any, groups: list[dict[str, Any]], timed: list[Any],
          options: dict[str, Any]) -> Any:
    """An optimizer of ``optimizer``'s class and hyperparameters (``options`` over them) over copies of the ``timed``
    parameters, with copies of their gradients, its state built by a first update."""
    chosen = {id(p) for p in timed}
    copies = []
    for group in groups:
        params = []
        for p in group["params"]:
            if id(p) in chosen:
                copy = p.detach().clone()
                copy.grad = p.grad.detach().clone() if p.grad is not None else torch.randn_like(p) * 1e-3
                params.append(copy)
        if params:
            copies.append({**{k: v for k, v in group.items() if k != "params"}, **options, "params": params})
    # the groups hold every hyperparameter; the constructor takes those it names (AdamW's defaults hold Adam's
    # decoupled_weight_decay, which AdamW's constructor does not take)
    accepted = inspect.signature(type(optimizer).__init__).parameters
    probe = type(optimizer)(copies, **{k: v for k, v in {**optimizer.defaults, **options}.items() if k in accepted})
    probe.step()
    return probe


def _best_updates(updates: list[list[Any]], deadline: float, cuda: bool, torch: Any) -> list[float]:
    """One update of each list of optimizers, all of them stepped (s): the best of ``BURSTS`` bursts, the lists'
    bursts taking turns so that a machine's drift reaches them alike."""
    wait = torch.cuda.synchronize if cuda else (lambda: None)
    wait()
    sizes = []
    for optimizers in updates:
        started = time.perf_counter()
        for optimizer in optimizers:
            optimizer.step()
        wait()
        sizes.append(max(1, int(BURST_S / max(time.perf_counter() - started, 1e-6))))
    best = [float("inf")] * len(updates)
    for _ in range(BURSTS):
        for i, (optimizers, size) in enumerate(zip(updates, sizes)):
            started = time.perf_counter()
            for _ in range(size):
                for optimizer in optimizers:
                    optimizer.step()
            wait()
            best[i] = min(best[i], (time.perf_counter() - started) / size)
        if time.perf_counter() > deadline:
            break
    return best
