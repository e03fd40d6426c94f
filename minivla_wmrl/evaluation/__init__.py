"""Judging policies and predictors: LIBERO's evaluation protocol, paired comparisons, the
statistics with the training seed as the unit, plots, episode videos and the prefix AUROC report."""
