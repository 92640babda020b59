"""Plan what you cannot run: predict the best pipeline for a model on a cluster.

`python -m harness.advise` searches schedule x pp x dp x M (B from the global batch) x v x
checkpointing x ZeRO x placement for one model on one cluster (`cluster=`, a Hydra group in
harness/conf/cluster/). Each point's step time comes from an exact discrete-event simulation of
its schedule (the simulator's semantics, fastsim.py) on the profile's per-layer times at its
microbatch size, partitioned as partition=profile does, with every message priced by the link
it crosses (intra- or inter-node) and each stage's data-parallel ring all-reduce priced by the
links its replicas span; its memory per GPU from the harness's memory theory
(harness/memory_theory.py, composed per layer: memory.py). What fits is ranked by predicted
throughput and written as advice.json, advice.md, a figure, and the commands that run the top
points for real.

Modules: cluster.py (the cluster description), profiles.py (per-layer costs), fastsim.py (the
simulator, makespan only, per-link hops), memory.py (per-rank bytes), search.py (the space, one
point's prediction, the ranking), report.py (the files), calibrate.py (cluster=here, measured),
validate.py (predicted against measured on this machine), derive.py (the 70B example's derived
one-block profile), __main__.py (the CLI).
"""
