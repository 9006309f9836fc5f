from workflows.models.demo import DemoLedger, DemoOrder
from workflows.models.replay import TaskReplay
from workflows.models.step import StepCheckpoint
from workflows.models.task import Task
from workflows.models.transition import TaskTransition

__all__ = ["DemoLedger", "DemoOrder", "StepCheckpoint", "Task", "TaskReplay", "TaskTransition"]
