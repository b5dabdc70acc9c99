"""What the demo models Hearth trains can do, and the features that need a trained one (memory synthesis,
the vision model): `make check-demo`, which trains them first; not part of `make test`."""
