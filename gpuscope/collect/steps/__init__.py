"""The steps collector's machinery (the collector is ``collect/collectors/steps.py``): the loop's thread and the
loop it runs (``loopthread``, ``loops``), where each step begins and ends (``optimizer_watch``, ``forward_modules``),
its phases and their clock (``phase_clock``, ``device_timeline``), the DataLoaders it times (``loaders``), the step
listeners other collectors register (``step_listeners``), and the log the steps are reduced from (``steplog``)."""
