"""The agent service and what runs it: the Agent, the component registries, config loading and
its reference, health endpoints, progress line, host checks.
"""
