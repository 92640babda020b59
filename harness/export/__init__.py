"""`python -m harness.export --to torchtitan|megatron <run dir | advice.json#RANK> [--out FILE]`:
what torchtitan 0.3.0 and Megatron-LM take today for a run or an advice point, as a bash script
whose header says the source, how each setting maps and what the tool cannot express.

point.py reads either source into one Recipe (the planner's Point, harness/planning/point.py,
and what a script needs beyond it); torchtitan.py and megatron.py render it (script.py: the
header and the quoted command); __main__.py is the command line. Nothing here imports the
runtime: a run's record and an advice point are all it reads.
"""
