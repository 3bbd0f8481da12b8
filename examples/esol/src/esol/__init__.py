"""ESOL aqueous solubility from SMILES: the worked example built on the snakedvc kit."""

__version__ = "0.1.0"
