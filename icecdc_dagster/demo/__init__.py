"""``icecdc demo``: a local lakehouse with a changing table, synced end to end."""
