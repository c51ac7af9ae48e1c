"""The Step Functions steps (Prepare, Plan, Worker, Finalize, Cleanup,
scheduled maintenance), pure over ports; the Lambda handlers in functions/
only parse, call one of these, and return."""
