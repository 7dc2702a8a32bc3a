"""Keyed state: the driver's columnar state, owner tasks and their spans, the executor cache, restore checks."""
