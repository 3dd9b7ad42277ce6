"""The queue process package: `python -m rq.queue --root ROOT --name NAME`."""
