"""Router mode: every model in the library on one port, each in its own process."""
