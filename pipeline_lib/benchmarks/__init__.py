"""Benchmarks: commands that measure against a real alternative in the same run and print ratios."""
