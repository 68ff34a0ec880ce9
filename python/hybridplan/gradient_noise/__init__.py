"""The gradient noise scale B_simple and the critical batch it gives.

    noise_scale      B_simple from squared gradient norms at two batch sizes: the estimator
                     (estimate_from_norms) and its offline measurement (noise_scale)
    noise_scale_job  a Job whose critical batch is the measured noise scale; switch_advice

Both the executor (its online meter, apply(..., measure_noise_scale=N), and the switch advice
of the adaptive mode) and convergence (the noise scale along a trade-off run) use them, so they
stand below both; they import only the planner. `hybridplan.noise_scale`,
`hybridplan.critical_batch_job` and `hybridplan.switch_advice` are the public names.

Nothing is imported here: import the module you need."""
