"""Router mode: model processes, presets, several web nodes and remote hosts."""
