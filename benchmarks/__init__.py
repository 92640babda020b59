"""make bench's verdict (judge.py) and the baseline it compares with (baseline.json, README.md)."""
