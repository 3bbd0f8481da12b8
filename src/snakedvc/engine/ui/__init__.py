"""`snakedvc ui`: one live page for the project's runs, sweeps and experiments (issue 53)."""
