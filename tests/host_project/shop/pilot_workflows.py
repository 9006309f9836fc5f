"""The host's own workflow (docs/embedding.md, step 6): PILOT imports every
installed app's `pilot_workflows` module."""

from workflows.sdk import define_workflow

receipt = define_workflow("shop.receipt", max_attempts=3)


@receipt.step
def total(ctx):
    return {"total": sum(item["price"] for item in ctx.payload["items"])}


@receipt.step
def send(ctx):
    return {"sent_to": ctx.payload["email"], "total": ctx.outputs["total"]["total"]}
