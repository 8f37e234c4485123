"""bullmq-py workers with ``use_actor_lock_manager``, judged by BullMQ's own checks."""
