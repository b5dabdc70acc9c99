"""What each job kind does, run inside the job's child process. No Django:
a kind reads its config, emits events to the log and returns the output
directory and a summary."""
