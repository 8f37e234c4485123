"""Interop tests: our lock manager beside BullMQ's own Python and Node.js runtimes."""
