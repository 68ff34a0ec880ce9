"""How a training step's backward runs where it is not one plain backward: activation recompute
(recompute: the forward run again before the backward, fully or selectively) and the
zero-bubble schedules' split of a stage's backward into I and W (split_backward). The executor
applies them and the profiler times them, so both import them from here, below both; nothing
here imports the rest of hybridplan.

Nothing is imported here: import the module you need."""
