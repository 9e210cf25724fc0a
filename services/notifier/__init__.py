"""The notifier: the durable outbox of notifications and the conversation history.

Foundation stage: the outbox (enqueue idempotently, list) and its database exist;
delivery with retries, conversation messages and response streams come with the
notifier issue and answer UNIMPLEMENTED until then.
"""
