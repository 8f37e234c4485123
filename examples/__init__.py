"""Runnable examples of the lock manager, one idea per file."""
