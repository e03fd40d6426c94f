"""Speed benchmarks (`minivla-wmrl bench ...`): ratios measured side by side in one run."""
