"""Federated training: the rounds with retention, loading a trained run, resuming one."""
