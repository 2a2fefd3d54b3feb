"""Code that runs inside shmpool's worker processes: the command loop and the env slot."""
