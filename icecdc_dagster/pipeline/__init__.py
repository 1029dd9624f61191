"""Orchestrator-neutral steps of a sync: which batch comes next, computing and storing it.

The Dagster layer (assets, sensors) and the CLI are thin shells around this
package; nothing here imports Dagster.
"""
