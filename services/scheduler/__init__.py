"""The scheduler: tasks, attempts, worker processes, timers and cancellation."""
