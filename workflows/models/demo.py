"""DemoOrder: the rows `demo.sync_orders` writes (SPEC §12).

Deliberately without a unique constraint on (batch, n): a double write would
be visible as extra rows, which is how the tests prove exactly-once.
"""

from django.db import models
from django.utils import timezone


class DemoOrder(models.Model):
    batch = models.CharField(max_length=100)
    n = models.IntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # Counting a batch's rows: WHERE batch = ?.
            models.Index(fields=["batch"], name="demoorder_batch_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.batch}#{self.n}"
