from workflows.models.activity import ActivityMinute
from workflows.models.demo import DemoLedger, DemoOrder
from workflows.models.replay import TaskReplay
from workflows.models.schedule import MissedPolicy, PilotSchedule, ScheduleOrigin
from workflows.models.signal import TaskSignal
from workflows.models.step import StepCheckpoint
from workflows.models.task import Task
from workflows.models.token import ApiToken
from workflows.models.transition import TaskTransition
from workflows.models.webhook import (
    ClientWebhook,
    DeliveryState,
    WebhookDelivery,
    WebhookEndpoint,
)

__all__ = ["ActivityMinute", "ApiToken", "ClientWebhook", "DeliveryState", "DemoLedger",
           "DemoOrder", "MissedPolicy", "PilotSchedule", "ScheduleOrigin", "StepCheckpoint",
           "Task", "TaskReplay", "TaskSignal", "TaskTransition", "WebhookDelivery",
           "WebhookEndpoint"]
