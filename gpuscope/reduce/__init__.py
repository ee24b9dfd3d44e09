"""The second stage: the collectors' payloads (and torch.profiler traces) reduced to the record's figures: the
steady-state split of the steps, the op table, the kernel timeline, the FLOPs against a peak (``fields``)."""
