"""Measuring this machine and the model against the cost model.

    probe            `hybridplan probe`: links and devices into a Cluster (the simpler, older way)
    calibration      `hybridplan calibrate`: what the executor really pays, into a Cluster
    validation       `hybridplan validate`: plans run on this machine, predicted beside measured
    verdict          validate's verdict: targets met or missed, plans unsteady on this host
    validate_worker  one rank of a validation run
    time_to_target   `hybridplan validate --time-to-target`: plans trained to a convergence
                     task's target under torchrun, time to target predicted beside measured
    time_to_target_worker  one rank of such a run
    fitting          the least-squares fits the measurements are reduced with
    timing           timing repeated calls: warm-up, the device synchronized, the slowest rank

Nothing is imported here: `hybridplan.calibrate` and `hybridplan.validate` load their module.
"""
