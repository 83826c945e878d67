"""The serve service: answers requests with the newest model version that passed the promotion gate."""
