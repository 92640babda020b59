"""Programs run by hand, outside the importable `harness` package: `make calibrate`
(tools/calibrate.py: this machine as cluster=here), `make advise-validate`
(tools/advise_validate.py: the advisor's predictions against runs on this machine), and
`make gpu-check` (tools/gpu_check.sh). Run them from the repository's root
(`python -m tools.calibrate`)."""
