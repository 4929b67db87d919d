"""Client unlearning requests: the request, the recovery methods, the journal and the adoption of the new history."""
