"""The API's task representation: workflows.representation (the webhooks send it too)."""

from workflows.representation import delivery_data, step_data, task_data

__all__ = ["delivery_data", "step_data", "task_data"]
