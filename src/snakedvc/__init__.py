"""snakedvc: Snakemake + DVC + PyTorch on SLURM, with an ESOL worked example."""

__version__ = "0.1.0"
