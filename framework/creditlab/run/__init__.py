"""Running a run: composing and validating its config, building its parts and model, the data, the
launch (run directory records, ranks, resume), one rank's fit, logging, progress and the memory
plan; the Hydra job (:mod:`~creditlab.run.hydra_main`) that ``creditlab train`` hands over to."""
