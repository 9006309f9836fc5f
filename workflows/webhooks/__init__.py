"""Completion webhooks' pure parts (docs/webhooks.md): where a webhook may go
(targets), how it is signed (signing), how one attempt is sent (http). The
engine's part — the outbox, claims, retries — is workflows.engine.deliveries."""
