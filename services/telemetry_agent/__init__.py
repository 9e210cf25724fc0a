"""telemetry-agent: samples the process trees of watched tasks on one worker host.

Layout: ``domain`` (types and rules), ``sampler`` (membership, identity fences,
sums and activity; pure apart from the injected table source and reader),
``procread`` (psutil reads of one process), ``broadcast`` (bounded fan-out),
``agent`` (watch list, sampling loop in a worker thread, root-exit pidfds),
``servicer`` + ``convert`` (gRPC edge), ``__main__`` (wiring).
"""
