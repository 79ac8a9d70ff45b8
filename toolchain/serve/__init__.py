"""`trtc serve`'s parts: label events (events.py). Each part is a library piece with its own tests; see docs/SERVE.md."""
