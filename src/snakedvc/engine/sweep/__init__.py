"""Hyperparameter sweeps over any workflow: search space, successive halving, promotion, report, save.

A sweep (config ``snakedvc.sweep``) is a set of trials, each the workflow's config with a few
dotted keys overridden. Trials train in rungs: rung r trains every survivor of rung r-1 on to
the rung's epochs (the config key named by ``budget``), continuing from the state its previous
rung ended in; the best of a rung by ``metric`` (``direction`` min or max) go on. Strategy
``full`` is one rung at the budget. The workflow decides promotions at run time (a Snakemake
checkpoint per rung, in the kit's ``sweep`` module).

The one entry point is ``plan(config)`` (``snakedvc.sweep_plan``): a ``SweepPlan``, whose public
members are the trial rule's outputs, params and inputs. The contract with the workflow's trial
rule (``use rule train as sweep_trial with:``): it writes into its trial folder ``metrics_file``
(JSON with the metric, or ``error``) and ``state_file`` (the state a later rung continues from).

Inside: ``space`` (trials from the search space), ``plan`` (rungs, file layout), ``promotion``
(a rung's ranking), ``report`` (summary, plot, HTML section), ``save`` (one DVC experiment per trial).
"""

from snakedvc.engine.sweep.plan import SweepPlan, plan

__all__ = ["SweepPlan", "plan"]
