"""The host side: what runs where Snakemake runs (the submit host, or a detached run's controller).

Config and settings, the workflow's calls (configure, tracked, finish_run), DVC tracking, run
records, sweeps, detached runs and their controller, the report. These need the engine install
(Snakemake, DVC, jsonschema); a rule's job never imports them. Everything outside this package
(launch, lease, logs, progressbar, io, errors, live, torch, and slurm, which both sides ask) can
run inside a job, with the step install.
"""
