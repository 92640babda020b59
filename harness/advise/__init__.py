"""Plan what you cannot run: predict the best pipeline for a model on a cluster.

`python -m harness.advise` searches schedule x pp x tp x dp x M (B from the global batch) x v x
checkpointing x ZeRO x placement for one model on one cluster (`cluster=`, a Hydra group in
harness/conf/cluster/). Each point is a harness Config: kept if the harness's own validation
accepts it (harness/planning/checks.py), predicted as `python -m harness executor=sim` would (the plan,
priced by harness/simulate/pricing.py, the one simulator, harness/planning/memory_theory.py). What fits
is ranked by predicted throughput and written as advice.json, advice.md and advice.html (one
page), a figure, and the commands that run the top points for real, and that reproduce each
prediction.

Modules: problem.py (the command line to a Problem), search.py (the space, one point's
prediction, the ranking), report.py (the files), page.py (the page as report blocks),
figure.py (advice.png), bubble.py (the recommended point's bubble in parts), derive.py (the 70B
example's derived one-block profiles, per TP rank at --tp), __main__.py (the CLI). Run by hand, outside the package:
tools/calibrate.py (`make calibrate`: cluster=here, measured) and tools/advise_validate.py
(`make advise-validate`: predicted against measured on this machine).
"""
