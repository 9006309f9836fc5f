"""The host's own Django task (docs/django-tasks.md): one shipment per order,
however often the order's code enqueues it."""

from workflows.django_tasks import task


@task(key_fields=("order_id",))
def ship(order_id, address):
    return {"order": order_id, "shipped_to": address}
