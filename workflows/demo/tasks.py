"""The demo tasks of Django's task framework (docs/django-tasks.md):
`@task` functions that PILOT runs as one-step workflows named by their module
path. Registered with the demo workflows (PILOT_DEMO_WORKFLOWS), on the first
PilotTaskBackend of settings.TASKS; without one there are none.

    workflows.demo.tasks.add(a, b)               -> a + b
    workflows.demo.tasks.charge(order_id, amount) -> {"order": order_id, "charged": amount}
                                                    (key_fields=("order_id",): one charge
                                                    per order)
"""

from workflows.django_tasks import pilot_task_backend_alias, task

BACKEND = pilot_task_backend_alias()

if BACKEND is not None:
    @task(backend=BACKEND)
    def add(a, b):
        return a + b

    @task(backend=BACKEND, key_fields=("order_id",))
    def charge(order_id, amount):
        return {"order": order_id, "charged": amount}
