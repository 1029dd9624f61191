"""Sensors: one per source table, materialising snapshots strictly in commit order."""
