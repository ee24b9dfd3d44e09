"""The wrapped ``__call__``'s cost on a call of an instance that is neither a root nor a frozen model: a Linear of the
model, its class wrapped because a frozen ``nn.Linear`` of the script's own is timed (``forward_modules``). The
fastest of 7 rounds of 20,000 calls, without and with the wrapper:

    python benchmarks/wrapper_cost.py
"""
import time, statistics, torch, torch.nn as nn
from gpuscope.collect.steps.forward_modules import ForwardModules
from gpuscope.collect.steps.frozen_models import FrozenModels
layer, frozen = nn.Linear(4, 4), nn.Linear(4, 4).requires_grad_(False)
x = torch.randn(2, 4)
def bench():
    best = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(20000):
            layer(x)
        best.append((time.perf_counter() - t) / 20000)
    return min(best)
plain = bench()
fm = ForwardModules(lambda m: False, lambda: None, FrozenModels(time.perf_counter, lambda: 0))
fm.frozen.add([frozen], 0)
fm._wrap_classes([frozen])
wrapped = bench()
fm.remove()
print(f"plain {plain*1e6:.2f} us, wrapped class {wrapped*1e6:.2f} us, +{(wrapped-plain)*1e9:.0f} ns a call")
