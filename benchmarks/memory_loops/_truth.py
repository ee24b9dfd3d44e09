"""Ground truth for the known-size loops, measured in plain python without gpuscope (memory_accuracy.py runs each
loop with ``--truth`` or ``--peak`` in a fresh process): parameter, gradient and optimizer-state bytes counted from
the tensors, the activations saved for backward counted with ``torch.autograd.graph.saved_tensors_hooks`` over one
forward, and the peak of torch's allocations over one steady step from torch.profiler's raw memory events."""

from __future__ import annotations

import json
import resource
import sys

import torch


def storage_key(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def sizes(model: torch.nn.Module, opt: torch.optim.Optimizer, forward, step) -> dict:
    """After ``step()`` has run a few times: parameter, gradient and optimizer-state bytes, and the storages saved
    for backward by one ``forward()`` (returning the loss), each once, parameters left out."""
    params = list(model.parameters())
    param_keys = {storage_key(p) for p in params}
    parameters = sum(p.numel() * p.element_size() for p in params)
    opt.zero_grad(set_to_none=True)
    saved: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor):
        key = storage_key(t)
        if key not in param_keys and key[1] > 0:
            saved[key] = key[1]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, batch = forward()
    batch_keys = {storage_key(b) for b in batch}
    saved_inputs = {k for k in saved if k in batch_keys}
    loss.backward()
    gradients = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    opt.step()
    state_tensors = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    state = sum(v.untyped_storage().nbytes() for v in state_tensors)
    state_big = sum(v.untyped_storage().nbytes() for v in state_tensors if v.dim() > 0)
    return {
        "parameters_bytes": parameters,
        "parameter_tensors": len(params),
        "gradients_bytes": gradients,
        "optimizer_state_bytes": state,
        "optimizer_state_moments_bytes": state_big,
        "optimizer_state_step_scalars_bytes": state - state_big,
        "activations_bytes": sum(saved.values()),
        "activations_storages": len(saved),
        "activations_batch_bytes": sum(saved[k] for k in saved_inputs),
        "batch_bytes": sum(b.untyped_storage().nbytes() for b in batch),
    }


def peak(model: torch.nn.Module, opt: torch.optim.Optimizer, step, batch) -> dict:
    """One steady step (forward, backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)``) under
    torch.profiler with ``profile_memory``: the running sum of its raw allocation events (kineto's ``[memory]``
    events, signed bytes, in time order) from the step's start, at its highest. What is live at the start (the
    parameters, the optimizer's state, the batch: nothing else, the gradients being None) is counted from the
    tensors and added."""
    from torch.profiler import ProfilerActivity, profile

    opt.zero_grad(set_to_none=True)
    base = {storage_key(p) for p in model.parameters()}
    base |= {storage_key(v) for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)}
    base |= {storage_key(b) for b in batch}
    baseline = sum(n for _, n in base)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    running = top = 0
    for _, nbytes in events:
        running += nbytes
        top = max(top, running)
    return {"baseline_bytes": baseline, "peak_above_start_bytes": top, "peak_bytes": baseline + top,
            "end_above_start_bytes": running, "memory_events": len(events),
            "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def emit(result: dict) -> None:
    print("MEMORY_TRUTH " + json.dumps(result), file=sys.stdout, flush=True)


def run(args, model: torch.nn.Module, opt: torch.optim.Optimizer, forward, step, batch) -> None:
    """A known-size loop's main: with ``--truth`` its sizes, with ``--peak`` one steady step's peak (each after three
    steps), else ``args.steps`` steps of training."""
    if args.truth or getattr(args, "peak", False):
        for _ in range(3):
            step()
        emit(sizes(model, opt, forward, step) if args.truth else peak(model, opt, step, batch))
        return
    for _ in range(args.steps):
        loss = step()
    print(f"loss {loss.item():.4f}")
