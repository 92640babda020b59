"""The only package that touches process groups: launch, P2P, executor."""
