"""Imported by the forkserver (a preload module, after the rank loop's): runs once, in the
server, what each forked rank would otherwise run for the first time itself. Torch's first
seeding reads source files for its lazy device calls, and its first module move, backward and
optimizer step initialise dispatch paths: ~10 ms of CPU a rank, paid once per process here.

One thread, as the ranks run (harness/runtime/loop.py): the server starts no thread pool
that a fork would copy without its threads."""

import gc

import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
for make in (lambda p: torch.optim.SGD(p, lr=0.1), lambda p: torch.optim.AdamW(p, lr=0.1)):
    layer = nn.Linear(4, 4).to(device="cpu", dtype=torch.float32)
    optimizer = make(layer.parameters())
    layer(torch.zeros(2, 4, requires_grad=True)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
del layer, optimizer, make

# the ranks' collections then skip the server's heap (and do not copy its pages by touching them)
gc.freeze()
