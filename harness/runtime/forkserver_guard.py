"""Imported first by the forkserver (a preload module, nowhere else): the server dies with
the process that started it (harness/runtime/orphans.py)."""

from harness.runtime.orphans import die_with_parent

die_with_parent()
